package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

// pinLockTTL bounds how long a pin step may hold its key: a holder that
// died is waited out that long at most (a sweep frees it sooner, as its
// owner is dead).
const pinLockTTL = time.Minute

// lockPinKey serialises the pin steps of one key across every process
// that uses this containerd namespace, gpupin's own lock directory or not:
// a lease of a fixed ID is a mutex the daemon keeps, since creating one
// that exists fails.
func (r *Runtime) lockPinKey(ctx context.Context, key string) (func(), error) {
	ls := r.client.LeasesService()
	sum := sha256.Sum256([]byte(key))
	id := "gpupin-pinlock-" + hex.EncodeToString(sum[:8])
	for {
		l, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(pinLockTTL),
			leases.WithLabels(map[string]string{LabelManaged: "true", LabelOwner: owner, LabelRole: "pin-lock"}))
		if err == nil {
			return func() { ls.Delete(context.WithoutCancel(ctx), l) }, nil
		}
		if !errdefs.IsAlreadyExists(err) {
			return nil, fmt.Errorf("lock pin %s: %w", key, err)
		}
		// Held: by a live pin step, or left by a dead one past its time.
		if held, err := ls.List(ctx, fmt.Sprintf("id==%q", id)); err == nil && len(held) == 1 &&
			time.Since(held[0].CreatedAt) > pinLockTTL {
			ls.Delete(ctx, held[0])
			continue
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another pin step of %s: %w", key, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
