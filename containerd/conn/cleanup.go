package conn

import (
	"context"
	"time"

	"github.com/containerd/errdefs"
)

// cleanupWindow is how long a cleanup keeps trying: long enough for a
// containerd that restarted to answer again. Cleanup is not optional (a
// sweep leaves alone what a live process owns), so it waits for the daemon.
const cleanupWindow = 30 * time.Second

// Cleanup runs fn until it succeeds, finds nothing to remove, or the window
// closes, whatever became of the caller's context.
func Cleanup(ctx context.Context, fn func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupWindow)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		err := fn(cctx)
		if err == nil || errdefs.IsNotFound(err) {
			return nil
		}
		select {
		case <-cctx.Done():
			return err
		case <-time.After(wait):
		}
		if wait < time.Second {
			wait *= 2
		}
	}
}
