package containerd

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

// Fallbacks is how many layers this process began to extract and then,
// other than by their stream being dropped, left to the daemon.
func Fallbacks() int64 { return fallbacks.Load() }

// Moves is how many layers this process extracted without their parent
// and then moved onto it (rehome.go).
func Moves() int64 { return moves.Load() }

// SyncSnapshots is what SetPin waits for: the snapshots' filesystem
// synced; gens is how many syncs were asked of this runtime so far.
func (r *Runtime) SyncSnapshots(ctx context.Context) (gens uint64, err error) {
	err = r.flush.sync(ctx)
	r.flush.mu.Lock()
	defer r.flush.mu.Unlock()
	return r.flush.want, err
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

// LowerDirs is lowerDirs: the layer directories a view's mounts name.
var LowerDirs = lowerDirs
