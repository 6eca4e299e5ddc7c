package runtime

import (
	"context"
	"time"
)

// Hooks for runtime_test: what a test must hold or name that the package
// keeps to itself.

// HoldZstdBudget takes the whole zstd decoders' budget until release.
func HoldZstdBudget() (release func()) {
	zstdSem.Acquire(context.Background(), zstdWindowBudget)
	return func() { zstdSem.Release(zstdWindowBudget) }
}

// LockPinKey is lockPinKey.
func (r *Runtime) LockPinKey(ctx context.Context, key string) (func(), error) {
	return r.lockPinKey(ctx, key)
}

// PinLockID is the ID of key's pin lock lease.
func PinLockID(key string) string { return pinLockID(key) }

// SetRecoverLockWait sets how long Recover waits for a key's pin lock.
func SetRecoverLockWait(d time.Duration) (restore func()) {
	old := recoverLockWait
	recoverLockWait = d
	return func() { recoverLockWait = old }
}
