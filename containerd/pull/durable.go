package pull

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// When the image's files are on disk, and who waits for it.
//
// Neither containerd nor tar syncs what a layer's extraction writes: the
// files sit in the page cache until the kernel writes them back, about
// 30 s later. overlayfs syncs its upper filesystem whenever a mount of it
// goes, so the probe's container, unmounted at its end, waited for every
// byte the pull had written (0.9 s a gigabyte here), and that wait was
// all that put a proved image on disk before its pin. Now it is said: a
// pull that extracts here asks for the snapshots' filesystem to be synced
// every syncEvery, so writeback runs beside decompression, which leaves
// the disk idle, and little is left for the probe's unmount; and SetPin
// waits for a sync begun after it was called. Where the daemon applied
// every layer (no snapshot directory seen here), the probe's unmount is
// still what syncs them.

// syncEvery is how often a pull that extracts here asks for the snapshots
// written so far to go to disk.
const syncEvery = time.Second

// flusher runs syncfs(2) on the snapshots' filesystem, one at a time, for
// whoever asks: a request is met by a sync that began after it.
type flusher struct {
	mu      sync.Mutex
	f       *os.File // a directory on the snapshots' filesystem; nil until one is seen
	want    uint64   // generations asked for
	done    uint64   // generations met
	failed  error    // the first sync that failed: sticky, see wait
	running bool
	closing bool
	changed chan struct{} // closed when done moves
	syncfs  func(fd int) error
}

func newFlusher() *flusher { return &flusher{changed: make(chan struct{}), syncfs: unix.Syncfs} }

// see records a directory on the snapshots' filesystem (a snapshot's
// upper directory), the first time one is seen.
func (f *flusher) see(dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f != nil || f.closing {
		return
	}
	// The snapshots directory outlives any one snapshot's.
	root := dir
	if i := strings.LastIndex(dir, "/snapshots/"); i >= 0 {
		root = dir[:i+len("/snapshots")]
	}
	if d, err := os.Open(root); err == nil {
		f.f = d
	}
}

// kick asks for a sync and returns its generation (0: nothing to sync).
func (f *flusher) kick() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil || f.closing {
		return 0
	}
	f.want++
	if !f.running {
		f.running = true
		go f.run()
	}
	return f.want
}

func (f *flusher) run() {
	for {
		f.mu.Lock()
		target := f.want
		if f.closing && f.done < target {
			// Nobody waits for a closed runtime's syncs forever.
			f.done = target
			if f.failed == nil {
				f.failed = errors.New("the runtime was closed")
			}
			close(f.changed)
			f.changed = make(chan struct{})
		}
		if f.done >= target {
			f.running = false
			if f.closing && f.f != nil {
				f.f.Close()
				f.f = nil
			}
			f.mu.Unlock()
			return
		}
		fd := int(f.f.Fd())
		f.mu.Unlock()
		err := f.syncfs(fd)
		f.mu.Lock()
		f.done = target
		if err != nil && f.failed == nil {
			f.failed = err
		}
		close(f.changed)
		f.changed = make(chan struct{})
		f.mu.Unlock()
	}
}

// wait waits for generation gen to be met. A sync that ever failed fails
// every wait after it: syncfs reports a writeback error once, maybe to a
// sync nobody waited for (the pull's), and the files it lost are not on
// disk whatever later syncs say.
func (f *flusher) wait(ctx context.Context, gen uint64) error {
	for {
		f.mu.Lock()
		done, failed, changed := f.done, f.failed, f.changed
		f.mu.Unlock()
		if done >= gen {
			if failed != nil {
				return fmt.Errorf("syncfs of the snapshots' filesystem: %w", failed)
			}
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the snapshots to reach the disk: %w", ctx.Err())
		}
	}
}

// sync puts what was written to the snapshots' filesystem so far on disk.
func (f *flusher) sync(ctx context.Context) error {
	gen := f.kick()
	if gen == 0 {
		return nil
	}
	return f.wait(ctx, gen)
}

// every kicks the flusher each interval until stop is called.
func (f *flusher) every(interval time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f.kick()
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// close lets the directory go, now or when the running sync ends.
func (f *flusher) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closing = true
	if f.f != nil && !f.running {
		f.f.Close()
		f.f = nil
	}
}
