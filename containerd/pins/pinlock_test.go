package pins_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/pins"
)

// holdPinLock makes key's pin lock lease as a holder labelled owner would
// (another live process: the test's parent, go test).
func holdPinLock(t *testing.T, w *pinWorld, key, owner string) leases.Lease {
	t.Helper()
	l, err := w.rt.Client().LeasesService().Create(w.nsctx(), leases.WithID(pins.PinLockID(key)),
		leases.WithExpiration(time.Hour),
		leases.WithLabels(map[string]string{containerd.LabelManaged: "true", containerd.LabelOwner: owner, containerd.LabelRole: "pin-lock"}))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A pin lock is the daemon's, across processes: a holder that died loses
// it to the next pin step at once; a live one keeps it however long it
// holds it; and letting go frees one's own holding, never one taken since.
func TestPinLock(t *testing.T) {
	w := newPinWorld(t)
	ctx := context.Background()

	// lockSoon takes key's lock within 10 s (a lock that is not broken
	// would be waited for until then) and lets go.
	lockSoon := func(t *testing.T, key, left string) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		unlock, err := w.rt.Store().LockPinKey(cctx, key)
		if err != nil {
			t.Fatalf("lock left by %s: %v", left, err)
		}
		unlock()
	}

	t.Run("a dead holder's lock is broken at once", func(t *testing.T) {
		holdPinLock(t, w, "eng:1", deadOwner(t))
		lockSoon(t, "eng:1", "a dead process")
	})

	t.Run("a live holder keeps it", func(t *testing.T) {
		l := holdPinLock(t, w, "eng:1", containerd.OwnerOf(os.Getppid()))
		defer w.rt.Client().LeasesService().Delete(w.nsctx(), l)
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if unlock, err := w.rt.Store().LockPinKey(cctx, "eng:1"); err == nil {
			unlock()
			t.Fatal("took a lock a live process holds")
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiting for a live holder: %v", err)
		}
	})

	// A lock request that gave up (its deadline) may still be made by the
	// daemon after: owned by this live process, it holds no call's nonce,
	// and the next pin step breaks it rather than wait for its expiry.
	t.Run("this process's orphan is broken", func(t *testing.T) {
		holdPinLock(t, w, "eng:1", containerd.OwnerOf(os.Getpid()))
		lockSoon(t, "eng:1", "a request of this process that gave up")
	})

	t.Run("letting go frees only one's own holding", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		unlock, err := w.rt.Store().LockPinKey(cctx, "eng:1")
		if err != nil {
			t.Fatal(err)
		}
		// Meanwhile the lock went to another holder (as when a holder is
		// taken for dead): the first one's unlock must not free it.
		ls := w.rt.Client().LeasesService()
		if err := ls.Delete(w.nsctx(), leases.Lease{ID: pins.PinLockID("eng:1")}); err != nil {
			t.Fatal(err)
		}
		other := holdPinLock(t, w, "eng:1", containerd.OwnerOf(os.Getppid()))
		unlock()
		held, err := ls.List(w.nsctx(), `id=="`+other.ID+`"`)
		if err != nil || len(held) != 1 {
			t.Fatalf("the other holder's lock after the first one let go: %v, %v", held, err)
		}
		ls.Delete(w.nsctx(), other)
	})
}

// One key whose repair cannot take its lock does not fail the reading of
// pins: Pins lists what containerd holds, and the key is repaired on a
// later pass.
func TestPinsListedWhenARepairWaits(t *testing.T) {
	defer pins.SetRecoverLockWait(200 * time.Millisecond)()
	w := newPinWorld(t)
	ctx := context.Background()
	w.pin(0)
	if err := w.rt.Client().ImageService().Delete(w.nsctx(), w.refs[0], images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	l := holdPinLock(t, w, "eng:1", containerd.OwnerOf(os.Getppid()))
	pins, err := w.rt.Pins(ctx)
	if err != nil {
		t.Fatalf("Pins with one key's repair waiting: %v", err)
	}
	if len(pins) != 0 {
		t.Fatalf("pins %+v; want none yet (the record is still gone)", pins)
	}
	w.rt.Client().LeasesService().Delete(w.nsctx(), l)
	pins, err = w.rt.Pins(ctx)
	if err != nil || len(pins) != 1 || pins[0].Ref != w.refs[0] {
		t.Fatalf("Pins once the lock is free: %+v, %v; want %s restored", pins, err, w.refs[0])
	}
}
