package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// debounce gathers the burst of events one save makes into one reload.
const debounce = 100 * time.Millisecond

// Watch reloads the files when they change, until ctx ends. It watches
// their directories, not the files: an editor that writes a new file and
// renames it over the old, and Kubernetes swapping a ConfigMap's ..data
// link, both replace the inode a file watch would hold. Every event in a
// directory triggers a reload; Reload applies only what changed.
func (a *Agent) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch files: %w", err)
	}
	defer w.Close()
	dirs := map[string]bool{}
	for _, p := range []string{a.opts.ConfigPath, a.opts.OverridesPath} {
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

// Watching is closed once Watch is watching: a change made after it is seen.
func (a *Agent) Watching() <-chan struct{} { return a.watching }

// Reloads counts the reloads Watch has done, good or refused.
func (a *Agent) Reloads() int64 { return a.reloads.Load() }
