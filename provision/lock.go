package provision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockEngine takes an exclusive file lock for one engine on this node, so
// that two processes (the agent and an operator's `gpupin provision`) do
// not provision it at once: the second waits, then finds the first's pin.
// The kernel drops the lock when the process dies, so a crash never
// leaves it held.
func lockEngine(ctx context.Context, dir, engine string) (func(), error) {
	if dir == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lock dir: %w", err)
	}
	sum := sha256.Sum256([]byte(engine))
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", engine, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", engine, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another gpupin provisioning %s: %w", engine, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
