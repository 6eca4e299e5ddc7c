package runtime

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"golang.org/x/sys/unix"
)

// When the image's files are on disk, and who waits for it.
//
// Neither containerd nor tar syncs what a layer's extraction writes: the
// files sit in the page cache until the kernel writes them back, about
// 30 s later. overlayfs syncs its upper filesystem whenever a mount of it
// goes, so the probe's container, unmounted at its end, used to wait for
// every byte the pull had written (0.8 s a gigabyte here), and that wait
// was the only thing that put a proved image on disk before its pin. Now
// it is said: a pin is written once the snapshots' filesystem is synced
// (SetPin), the pull has that writeback started while it extracts, so
// little is left by then, and the probe's overlay is volatile, since its
// own writes die with it.

// syncEvery is how often a pull that extracts here asks for the snapshots
// written so far to go to disk: writeback then runs beside decompression,
// which leaves the disk idle, instead of after it.
const syncEvery = time.Second

// flusher runs syncfs(2) on the snapshots' filesystem, one at a time, for
// whoever asks: a request is met by a sync that began after it.
type flusher struct {
	mu      sync.Mutex
	f       *os.File // a directory on the snapshots' filesystem; nil until one is seen
	want    uint64   // generations asked for
	done    uint64   // generations met
	err     error    // of the last sync
	running bool
	changed chan struct{} // closed when done moves
}

func newFlusher() *flusher { return &flusher{changed: make(chan struct{})} }

// see records a directory on the snapshots' filesystem (a snapshot's
// upper directory), the first time one is seen.
func (f *flusher) see(dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f != nil {
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
	if f.f == nil {
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
		if f.done >= target {
			f.running = false
			f.mu.Unlock()
			return
		}
		fd := int(f.f.Fd())
		f.mu.Unlock()
		err := unix.Syncfs(fd)
		f.mu.Lock()
		f.done, f.err = target, err
		close(f.changed)
		f.changed = make(chan struct{})
		f.mu.Unlock()
	}
}

// wait waits for generation gen to be met and returns that sync's error.
func (f *flusher) wait(ctx context.Context, gen uint64) error {
	for {
		f.mu.Lock()
		done, err, changed := f.done, f.err, f.changed
		f.mu.Unlock()
		if done >= gen {
			if err != nil {
				return fmt.Errorf("syncfs: %w", err)
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

func (f *flusher) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f != nil && !f.running {
		f.f.Close()
		f.f = nil
	}
}

// volatileRootfs turns a container's overlay root into a volatile one, so
// that its unmount does not sync the filesystem, where this process can
// sync that filesystem itself (it sees the upper directory) and the
// kernel has the option (5.10). ok is false when it is left as it is.
func volatileRootfs(mounts []mount.Mount, kernelHasIt bool) (_ []mount.Mount, upper string, ok bool) {
	if len(mounts) != 1 || mounts[0].Type != "overlay" || !kernelHasIt {
		return nil, "", false
	}
	m := mounts[0]
	for _, o := range m.Options {
		switch {
		case o == "volatile":
			return nil, "", false
		case strings.HasPrefix(o, "upperdir="):
			upper = strings.TrimPrefix(o, "upperdir=")
		}
	}
	if upper == "" || !isDir(upper) {
		return nil, "", false
	}
	m.Options = append(append([]string(nil), m.Options...), "volatile")
	return []mount.Mount{m}, upper, true
}

// overlayVolatile says whether the kernel's overlayfs takes "volatile".
var overlayVolatile = sync.OnceValue(func() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 10)
})

func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	// The minor may run on ("10-rc1"): its leading digits.
	n := 0
	for n < len(parts[1]) && parts[1][n] >= '0' && parts[1][n] <= '9' {
		n++
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1][:n])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}
