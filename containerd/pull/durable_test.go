package pull

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
)

func TestFlusher(t *testing.T) {
	ctx := context.Background()
	f := newFlusher()
	defer f.close()
	// No snapshot seen: nothing of this process's to sync.
	if err := f.sync(ctx); err != nil || f.want != 0 {
		t.Fatalf("sync before any directory: %v, %d generations", err, f.want)
	}
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
	// A generation not met by the deadline says so.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.wait(cctx, want+1); !errors.Is(err, context.Canceled) {
		t.Errorf("wait for a generation never asked for: %v, want context.Canceled", err)
	}
}

// syncfs reports a writeback error once: when the sync that got it was a
// pull's, which nobody waited for, the pin's own sync must still fail.
func TestFlusherWritebackErrorIsSticky(t *testing.T) {
	ctx := context.Background()
	f := newFlusher()
	defer f.close()
	f.see(t.TempDir())
	calls := 0
	f.syncfs = func(int) error {
		calls++
		if calls == 1 {
			return syscall.EIO
		}
		return nil
	}
	f.wait(ctx, f.kick()) // the pull's kick, its error unread
	for range 2 {
		if err := f.sync(ctx); !errors.Is(err, syscall.EIO) {
			t.Errorf("sync after a failed writeback: %v, want EIO", err)
		}
	}
	if calls != 3 {
		t.Errorf("%d syncs, want 3", calls)
	}
}

func TestFlusherClosed(t *testing.T) {
	f := newFlusher()
	f.see(t.TempDir())
	f.close()
	if err := f.sync(context.Background()); err != nil || f.f != nil {
		t.Errorf("sync of a closed flusher: %v (directory kept: %v)", err, f.f != nil)
	}
}
