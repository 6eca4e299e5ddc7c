package pins

import (
	"context"
	"time"
)

// Hooks for pins_test: what a test must hold or name that the package
// keeps to itself.

// LockPinKey is lockPinKey.
func (r *Store) LockPinKey(ctx context.Context, key string) (func(), error) {
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
