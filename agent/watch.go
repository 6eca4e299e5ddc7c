package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/gpupin/gpupin/images"
)

// debounce gathers the burst of events one save makes into one reload.
const debounce = 100 * time.Millisecond

// newWatcher makes the file watcher; tests make it fail, as an exhausted
// inotify limit (fs.inotify.max_user_instances) does.
var newWatcher = fsnotify.NewWatcher

// Watch reloads the files when they change, until ctx ends. It watches the
// files' directories, not the files: an editor that writes a new file and
// renames it over the old, and Kubernetes swapping a ConfigMap's ..data
// link, both replace the inode a file watch would hold. A symlinked
// overrides file is written through its link (images.UpdateOverrides), so
// the target's directory is watched too. Every event in a directory
// triggers a reload; Reload applies only what changed. It returns an
// error at once when the files cannot be watched (inotify exhausted):
// Maintain, which restores pins, does not depend on it.
func (a *Agent) Watch(ctx context.Context) error {
	w, err := newWatcher()
	if err != nil {
		return fmt.Errorf("watch files: %w", err)
	}
	defer w.Close()
	dirs := map[string]bool{}
	paths := []string{a.opts.ConfigPath, a.opts.OverridesPath}
	if a.opts.OverridesPath != "" {
		if t, err := images.OverridesTarget(a.opts.OverridesPath); err == nil && t != a.opts.OverridesPath {
			paths = append(paths, t)
		}
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		d := filepath.Dir(p)
		if dirs[d] {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
		dirs[d] = true
	}
	close(a.watching)
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			a.opts.Logger.Debug("file event", "name", ev.Name, "op", ev.Op.String())
			fire = time.After(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			a.opts.Logger.Warn("file watch", "err", err)
		case <-fire:
			fire = nil
			if err := a.Reload(); err != nil {
				a.opts.Logger.Error("reload: keeping the last good reading", "err", err)
			}
			a.reloads.Add(1)
		}
	}
}

// Maintain runs the agent's periodic pass every Options.SweepEvery until
// ctx ends, and returns once the pass in progress has finished (Run waits
// for it before the caller closes the runtime). Each pass:
//
//   - sweeps leftovers of dead owners (Options.Sweeper): the loop sweeps
//     at its start; this catches what is orphaned later, a process that
//     died after it (an old agent outliving the start of a new one, a
//     `gpupin provision` killed beside the agent). A sweep never touches
//     what a live process owns, pins, or replicas;
//   - restores pins other clients took (Options.Recoverer);
//   - checks that every ready engine's pin and local name are still
//     there (CheckPins), which only reads containerd;
//   - rewrites the NFD feature file if someone removed or edited it.
//
// It runs apart from Watch, so a node whose inotify is exhausted still
// gets its pins back within the period. A negative SweepEvery: no pass.
func (a *Agent) Maintain(ctx context.Context) {
	if a.opts.SweepEvery <= 0 {
		return
	}
	t := time.NewTicker(a.opts.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.pass(ctx)
	}
}

// pass is one periodic pass of Maintain.
func (a *Agent) pass(ctx context.Context) {
	s, err := a.opts.Sweeper.SweepOrphans(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		a.opts.Logger.Warn("periodic sweep of leftovers failed", "err", err)
	case s.Containers+s.Leases+s.Candidates > 0:
		a.opts.Logger.Info("swept leftovers of interrupted runs", "containers", s.Containers, "leases", s.Leases, "candidates", s.Candidates, "periodic", true)
	}
	a.recover(ctx)
	a.CheckPins(ctx)
	// Rewritten if someone removed or edited it.
	a.SyncFeatures()
	a.sweeps.Add(1)
}

// recover puts back pins that other clients took: kubelet's image GC on a
// containerd whose CRI plugin does not keep pinned images (1.6), a pull of
// a pinned reference. Each repair is logged; the loop's next pass answers
// from the restored pin.
func (a *Agent) recover(ctx context.Context) {
	done, err := a.opts.Recoverer.Recover(ctx)
	if err != nil && ctx.Err() == nil {
		a.opts.Logger.Warn("recovering pins failed", "err", err)
	}
	for _, r := range done {
		switch {
		case r.Action == "foreign":
			// Reported as the runtime found it (OnForeign: foundForeign).
		default:
			a.opts.Logger.Info("pin "+r.Action, "key", r.Key, "ref", r.Ref, "detail", r.Detail)
		}
	}
	if len(done) > 0 {
		a.loop.Kick()
	}
}

// Watching is closed once Watch is watching: a change made after it is seen.
func (a *Agent) Watching() <-chan struct{} { return a.watching }

// Reloads counts the reloads Watch has done, good or refused.
func (a *Agent) Reloads() int64 { return a.reloads.Load() }

// Sweeps counts the periodic passes Maintain has done, whatever they found.
func (a *Agent) Sweeps() int64 { return a.sweeps.Load() }
