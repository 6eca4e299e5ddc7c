// Package runtimetest holds a runtime's pin store to containerd's
// behaviour: Conformance runs the same cases over containerd.Runtime on a
// real daemon and over the in-memory stand-in (internal/memrt), so the
// fast tier's tests stand on behaviour a daemon was seen to have. It is
// modelled on Spegel's storetest.
package runtimetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/provision"
)

// Runtime is the part of a runtime the suite holds to containerd's
// behaviour: what provision reads and writes of pins (provision.PinReader,
// provision.PinWriter), and the unpin and recovery the CLI and the agent
// call.
type Runtime interface {
	provision.PinReader
	provision.PinWriter
	Unpin(ctx context.Context, key string) (*containerd.Pin, error)
	Recover(ctx context.Context) ([]containerd.Recovered, error)
}

// Harness is one fresh runtime and the means to set up a case: every
// hook is explicit, since the suite may not reach into either runtime.
type Harness struct {
	Runtime Runtime
	// Images are two image records of one repository (repo@sha256:…), as
	// a pull left them for candidates: neither pinned yet.
	Images [2]string
	// Has reports whether an image record of that name exists.
	Has func(t *testing.T, name string) bool
	// DeleteRecord deletes the image record as another client of
	// containerd does (kubelet's image GC, crictl rmi): its content stays.
	DeleteRecord func(t *testing.T, name string)
	// Relabel replaces the record's labels as another client's pull of
	// the name does (ctr pull, kubelet): its target stays.
	Relabel func(t *testing.T, name string)
	// LoseImage deletes the record and its content (the manifest a pin's
	// lease held): nothing is left to restore it from.
	LoseImage func(t *testing.T, name string)
}

// Key and Source are what the suite pins the Images as.
const (
	Key    = "eng:1"
	Source = "registry.test/eng:1"
	other  = "registry.test/other:1"
)

// Conformance runs every case, each over a Harness of its own.
func Conformance(t *testing.T, newHarness func(t *testing.T) Harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, h Harness)
	}{
		{"a pin is listed as set", pinIsListed},
		{"a held pin refuses another source", heldPinRefusesTakeover},
		{"a pin replaced becomes previous", replacedPinIsPrevious},
		{"unpin", unpin},
		{"unpin of nothing", unpinOfNothing},
		{"candidates discarded", candidatesDiscarded},
		{"pin of no record", pinOfNoRecord},
		{"listing does not recover, reading does", listingVersusReading},
		{"recovery after a lost image", recoveryAfterLostImage},
		{"recovery after a pull over the pin", recoveryAfterRelabel},
		{"an unpinned pin is not recovered", unpinnedIsNotRecovered},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newHarness(t)) })
	}
}

// pinOf is the suite's pin of h.Images[i] from source.
func pinOf(h Harness, i int, source string) containerd.Pin {
	return containerd.Pin{Key: Key, Ref: h.Images[i], Variant: []string{"cu13", "cu129"}[i], Source: source,
		Override: "auto", Node: "sha256-node", ProbedAt: time.Now(), Probe: "cuda", Verdict: `{"ok":true}`}
}

func setPin(t *testing.T, h Harness, i int, source string) containerd.Pin {
	t.Helper()
	p := pinOf(h, i, source)
	if err := h.Runtime.SetPin(context.Background(), p, containerd.SetPinOptions{}); err != nil {
		t.Fatalf("SetPin %s: %v", p.Ref, err)
	}
	return p
}

// list is ListPins (or, with recover, Pins) failing t on an error.
func list(t *testing.T, h Harness, recover bool) []containerd.Pin {
	t.Helper()
	read := h.Runtime.ListPins
	if recover {
		read = h.Runtime.Pins
	}
	pins, err := read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return pins
}

// expectPins fails t unless pins are exactly one pin of Key on ref from
// source, in the fields a caller reads (none at all when ref is "").
func expectPins(t *testing.T, what string, pins []containerd.Pin, ref, source string) {
	t.Helper()
	if ref == "" {
		if len(pins) != 0 {
			t.Fatalf("%s: %+v, want no pin", what, pins)
		}
		return
	}
	if len(pins) != 1 {
		t.Fatalf("%s: %d pins (%+v), want one of %s", what, len(pins), pins, ref)
	}
	p := pins[0]
	if p.Key != Key || p.Ref != ref || p.Source != source || p.Previous || p.Tampered {
		t.Fatalf("%s: %+v, want the pin of %s on %s from %s", what, p, Key, ref, source)
	}
	if p.Digest == "" || ref != refOn(ref, p.Digest) {
		t.Fatalf("%s: digest %q does not match %s", what, p.Digest, ref)
	}
	if p.Variant == "" || p.Node != "sha256-node" || p.Probe != "cuda" || p.Verdict != `{"ok":true}` || p.Override != "auto" {
		t.Fatalf("%s: %+v: a label read back differs from what was pinned", what, p)
	}
	if p.Local != "gpupin.local/"+Key {
		t.Fatalf("%s: local name %q, want gpupin.local/%s", what, p.Local, Key)
	}
}

// refOn is ref with its digest replaced by d.
func refOn(ref, d string) string {
	for i := len(ref) - 1; i >= 0; i-- {
		if ref[i] == '@' {
			return ref[:i+1] + d
		}
	}
	return ref
}

func pinIsListed(t *testing.T, h Harness) {
	setPin(t, h, 0, Source)
	expectPins(t, "ListPins", list(t, h, false), h.Images[0], Source)
	expectPins(t, "Pins", list(t, h, true), h.Images[0], Source)
	if !h.Has(t, "gpupin.local/"+Key) {
		t.Fatalf("no record of the pin's local name gpupin.local/%s", Key)
	}
	// The same source pins another variant without a takeover.
	setPin(t, h, 1, Source)
	expectPins(t, "after a pin of the same source", list(t, h, true), h.Images[1], Source)
}

// A key pinned from one source is not taken by another's metadata; only
// a takeover (the want named the key) replaces it.
func heldPinRefusesTakeover(t *testing.T, h Harness) {
	ctx := context.Background()
	setPin(t, h, 0, Source)
	p := pinOf(h, 1, other)
	err := h.Runtime.SetPin(ctx, p, containerd.SetPinOptions{})
	var held *containerd.HeldError
	if !errors.As(err, &held) || !errors.Is(err, containerd.ErrHeld) || errors.Is(err, containerd.ErrSuperseded) {
		t.Fatalf("SetPin from another source: %v, want a HeldError (ErrHeld)", err)
	}
	if held.Key != Key || held.Ref != h.Images[0] || held.Source != Source || held.Claimed != other || held.Tampered || held.Superseded {
		t.Fatalf("HeldError %+v, want it to name %s from %s, claimed by %s", held, h.Images[0], Source, other)
	}
	expectPins(t, "after the refusal", list(t, h, true), h.Images[0], Source)
	if err := h.Runtime.SetPin(ctx, p, containerd.SetPinOptions{Takeover: true}); err != nil {
		t.Fatalf("SetPin with Takeover: %v", err)
	}
	expectPins(t, "after the takeover", list(t, h, true), h.Images[1], other)
}

func previous(t *testing.T, h Harness) []containerd.Pin {
	t.Helper()
	prev, err := h.Runtime.PreviousPins(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return prev
}

// expectPrevious fails t unless the previous pins are ref's alone.
func expectPrevious(t *testing.T, what string, prev []containerd.Pin, ref string) {
	t.Helper()
	if len(prev) != 1 || prev[0].Ref != ref || !prev[0].Previous || prev[0].Key != Key || prev[0].Variant == "" {
		t.Fatalf("%s: previous pins %+v, want %s alone, kept for rollback", what, prev, ref)
	}
}

func replacedPinIsPrevious(t *testing.T, h Harness) {
	if prev := previous(t, h); len(prev) != 0 {
		t.Fatalf("previous pins before any pin: %+v", prev)
	}
	setPin(t, h, 0, Source)
	if prev := previous(t, h); len(prev) != 0 {
		t.Fatalf("previous pins after one pin: %+v", prev)
	}
	setPin(t, h, 1, Source)
	expectPrevious(t, "after a new pin", previous(t, h), h.Images[0])
	// Back to the first: the pin record is no longer a previous one.
	setPin(t, h, 0, Source)
	expectPins(t, "after the rollback", list(t, h, true), h.Images[0], Source)
	expectPrevious(t, "after the rollback", previous(t, h), h.Images[1])
}

func unpin(t *testing.T, h Harness) {
	ctx := context.Background()
	want := setPin(t, h, 0, Source)
	got, err := h.Runtime.Unpin(ctx, Key)
	if err != nil {
		t.Fatalf("Unpin: %v", err)
	}
	if got == nil || got.Ref != want.Ref || got.Key != Key || got.Source != Source {
		t.Fatalf("Unpin returned %+v, want the pin of %s", got, want.Ref)
	}
	expectPins(t, "after unpin", list(t, h, true), "", "")
	// The image stays, as a previous pin, until gc.
	if !h.Has(t, want.Ref) {
		t.Fatalf("unpin removed the record %s", want.Ref)
	}
	expectPrevious(t, "after unpin", previous(t, h), want.Ref)
	if h.Has(t, "gpupin.local/"+Key) {
		t.Fatalf("unpin left the local name gpupin.local/%s", Key)
	}
	if _, err := h.Runtime.Unpin(ctx, Key); !errdefs.IsNotFound(err) {
		t.Fatalf("a second Unpin: %v, want not found", err)
	}
}

func unpinOfNothing(t *testing.T, h Harness) {
	ctx := context.Background()
	for _, key := range []string{Key, "never:1"} {
		p, err := h.Runtime.Unpin(ctx, key)
		if !errdefs.IsNotFound(err) || p != nil {
			t.Fatalf("Unpin %s with no pin: %+v, %v; want nil and not found", key, p, err)
		}
	}
	expectPins(t, "after unpins of nothing", list(t, h, true), "", "")
	for _, ref := range h.Images {
		if !h.Has(t, ref) {
			t.Fatalf("an unpin of nothing removed %s", ref)
		}
	}
}

// A candidate that did not become a pin goes; a pin, a previous pin and a
// name with no record are left as they are.
func candidatesDiscarded(t *testing.T, h Harness) {
	ctx := context.Background()
	tests := []struct {
		name    string
		setup   func(t *testing.T)
		discard string
		gone    bool
	}{
		{"a candidate", func(*testing.T) {}, h.Images[1], true},
		{"a pin", func(t *testing.T) { setPin(t, h, 0, Source) }, h.Images[0], false},
		{"a previous pin", func(t *testing.T) {
			if _, err := h.Runtime.Unpin(ctx, Key); err != nil {
				t.Fatal(err)
			}
		}, h.Images[0], false},
	}
	// In order: each step leaves what the next builds on.
	for _, tc := range tests {
		tc.setup(t)
		if err := h.Runtime.DiscardCandidate(ctx, tc.discard); err != nil {
			t.Fatalf("%s: DiscardCandidate: %v", tc.name, err)
		}
		if has := h.Has(t, tc.discard); has == tc.gone {
			t.Fatalf("%s: DiscardCandidate %s: record there %v, want %v", tc.name, tc.discard, has, !tc.gone)
		}
	}
	expectPins(t, "after the discards", list(t, h, true), "", "")
	expectPrevious(t, "after the discards", previous(t, h), h.Images[0])
	if err := h.Runtime.DiscardCandidate(ctx, refOn(h.Images[0], "sha256:"+zeros)); err != nil {
		t.Fatalf("DiscardCandidate of a name with no record: %v", err)
	}
}

const zeros = "0000000000000000000000000000000000000000000000000000000000000000"

// A pin names a record that is there: one discarded (or never pulled) is
// refused.
func pinOfNoRecord(t *testing.T, h Harness) {
	if err := h.Runtime.DiscardCandidate(context.Background(), h.Images[1]); err != nil {
		t.Fatal(err)
	}
	p := pinOf(h, 1, Source)
	if err := h.Runtime.SetPin(context.Background(), p, containerd.SetPinOptions{}); !errdefs.IsNotFound(err) {
		t.Fatalf("SetPin of a discarded candidate: %v, want not found", err)
	}
	expectPins(t, "after the refused pin", list(t, h, true), "", "")
}

// reports are the Recovered of Key among done.
func reports(done []containerd.Recovered) []containerd.Recovered {
	return slices.DeleteFunc(slices.Clone(done), func(r containerd.Recovered) bool { return r.Key != Key })
}

// ListPins only reads: a pin whose record another client deleted is
// missing from it until Pins (which recovers first) puts it back.
func listingVersusReading(t *testing.T, h Harness) {
	p := setPin(t, h, 0, Source)
	h.DeleteRecord(t, p.Ref)
	for range 2 {
		expectPins(t, "ListPins after the record went", list(t, h, false), "", "")
	}
	if h.Has(t, p.Ref) {
		t.Fatalf("ListPins put %s back", p.Ref)
	}
	pins := list(t, h, true)
	expectPins(t, "Pins after the record went", pins, p.Ref, Source)
	if pins[0].Restored.IsZero() {
		t.Fatalf("Pins restored %+v without saying when", pins[0])
	}
	if !h.Has(t, p.Ref) {
		t.Fatalf("Pins listed %s but its record is not back", p.Ref)
	}
	done, err := h.Runtime.Recover(context.Background())
	if err != nil || len(reports(done)) != 0 {
		t.Fatalf("Recover after Pins restored: %+v, %v; want nothing to do", done, err)
	}
}

// Recover puts back a pin whose record went while its content stayed.
// Once its content is gone too nothing restores it: the key's proof and
// local name go, and the engine is proved again: the local name is
// gpupin's own, cleared, never reported foreign (its content went with
// the pin's; a copy from elsewhere brings its own).
func recoveryAfterLostImage(t *testing.T, h Harness) {
	ctx := context.Background()
	p := setPin(t, h, 0, Source)
	h.DeleteRecord(t, p.Ref)
	done, err := h.Runtime.Recover(ctx)
	if got := reports(done); err != nil || len(got) != 1 || got[0].Action != "recreated" || got[0].Ref != p.Ref {
		t.Fatalf("Recover after the record went: %+v, %v; want %s recreated, alone", done, err, p.Ref)
	}
	expectPins(t, "ListPins after Recover", list(t, h, false), p.Ref, Source)

	h.LoseImage(t, p.Ref)
	done, err = h.Runtime.Recover(ctx)
	local := "gpupin.local/" + Key
	if got := reports(done); err != nil || len(got) != 1 || got[0].Action != "cleared" || got[0].Ref != local {
		t.Fatalf("Recover after the image was lost: %+v, %v; want %s cleared, alone", done, err, local)
	}
	expectPins(t, "Pins after the image was lost", list(t, h, true), "", "")
	if h.Has(t, local) {
		t.Fatalf("the local name %s is left on a lost image", local)
	}
	if done, err := h.Runtime.Recover(ctx); err != nil || len(reports(done)) != 0 {
		t.Fatalf("a second Recover: %+v, %v; want nothing to do", done, err)
	}
	// The other image still pins.
	setPin(t, h, 1, Source)
	expectPins(t, "a new pin after the loss", list(t, h, true), h.Images[1], Source)
}

// A pull by another client writes the pin's record anew, without its
// labels: ListPins shows no pin, and Pins (Recover) puts the labels back.
func recoveryAfterRelabel(t *testing.T, h Harness) {
	p := setPin(t, h, 0, Source)
	h.Relabel(t, p.Ref)
	expectPins(t, "ListPins after the pull", list(t, h, false), "", "")
	done, err := h.Runtime.Recover(context.Background())
	if got := reports(done); err != nil || len(got) != 1 || got[0].Action != "relabelled" || got[0].Ref != p.Ref {
		t.Fatalf("Recover after the pull: %+v, %v; want %s relabelled, alone", done, err, p.Ref)
	}
	pins := list(t, h, false)
	expectPins(t, "ListPins after Recover", pins, p.Ref, Source)
	if pins[0].Restored.IsZero() {
		t.Fatalf("Recover restored %+v without saying when", pins[0])
	}
}

// What unpin took back is never restored, even with its record deleted.
func unpinnedIsNotRecovered(t *testing.T, h Harness) {
	ctx := context.Background()
	p := setPin(t, h, 0, Source)
	if _, err := h.Runtime.Unpin(ctx, Key); err != nil {
		t.Fatal(err)
	}
	h.DeleteRecord(t, p.Ref)
	done, err := h.Runtime.Recover(ctx)
	if err != nil || len(reports(done)) != 0 {
		t.Fatalf("Recover after unpin and delete: %+v, %v; want nothing", done, err)
	}
	expectPins(t, "Pins after unpin and delete", list(t, h, true), "", "")
}
