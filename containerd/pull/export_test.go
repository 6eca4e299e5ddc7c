package pull

import "context"

// Hooks for pull_test: what a test must hold or name that the package
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
// synced; gens is how many syncs were asked of this puller so far.
func (r *Puller) SyncSnapshots(ctx context.Context) (gens uint64, err error) {
	err = r.flush.sync(ctx)
	r.flush.mu.Lock()
	defer r.flush.mu.Unlock()
	return r.flush.want, err
}

// LowerDirs is lowerDirs: the layer directories a view's mounts name.
var LowerDirs = lowerDirs
