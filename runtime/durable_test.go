package runtime

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

func TestKernelAtLeast(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"6.18.44-fc-v1045", true},
		{"5.10.0-28-amd64", true},
		{"5.10-rc1", true},
		{"5.9.16", false},
		{"4.19.0-26-amd64", false},
		{"5", false},
		{"", false},
		{"x.y", false},
	} {
		if got := kernelAtLeast(tc.release, 5, 10); got != tc.want {
			t.Errorf("kernelAtLeast(%q, 5, 10) = %v, want %v", tc.release, got, tc.want)
		}
	}
}

func TestVolatileRootfs(t *testing.T) {
	upper := t.TempDir()
	overlay := mount.Mount{Type: "overlay", Source: "overlay", Options: []string{"index=off", "workdir=/w", "upperdir=" + upper, "lowerdir=/l"}}
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
		kernel bool
		want   bool
	}{
		{"overlay whose upper directory is here", []mount.Mount{overlay}, true, true},
		{"a kernel without the option", []mount.Mount{overlay}, false, false},
		{"upper directory not here (gpupin in a container)", []mount.Mount{{Type: "overlay", Options: []string{"upperdir=/nonexistent/fs", "lowerdir=/l"}}}, true, false},
		{"no upper directory", []mount.Mount{{Type: "overlay", Options: []string{"lowerdir=/a:/b"}}}, true, false},
		{"already volatile", []mount.Mount{{Type: "overlay", Options: []string{"upperdir=" + upper, "volatile"}}}, true, false},
		{"bind mount", []mount.Mount{{Type: "bind", Source: upper, Options: []string{"rbind", "rw"}}}, true, false},
		{"two mounts", []mount.Mount{overlay, overlay}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, dir, ok := volatileRootfs(tc.mounts, tc.kernel)
			if ok != tc.want {
				t.Fatalf("ok = %v, want %v", ok, tc.want)
			}
			if !ok {
				return
			}
			if dir != upper || len(got) != 1 || !slices.Contains(got[0].Options, "volatile") {
				t.Errorf("got %+v, upper %q", got, dir)
			}
			if slices.Contains(tc.mounts[0].Options, "volatile") {
				t.Error("the snapshotter's mounts were changed in place")
			}
		})
	}
}

func TestFlusher(t *testing.T) {
	ctx := context.Background()
	f := newFlusher()
	defer f.close()
	// No snapshot seen: nothing of this process's to sync.
	if err := f.sync(ctx); err != nil || f.want != 0 {
		t.Fatalf("sync before any directory: %v, %d generations", err, f.want)
	}
	dir := t.TempDir() + "/snapshots/7/fs"
	f.see(t.TempDir()) // a directory without /snapshots/ is its own root
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.sync(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sync %d: %v", i, err)
		}
	}
	f.mu.Lock()
	done, want := f.done, f.want
	f.mu.Unlock()
	if done != want || want != 8 {
		t.Errorf("done %d of %d generations, want 8 of 8", done, want)
	}
	f.see(dir) // seen already: kept
	// A generation not met by the deadline says so.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.wait(cctx, f.want+1); !errors.Is(err, context.Canceled) {
		t.Errorf("wait for a generation never asked for: %v, want context.Canceled", err)
	}
}
