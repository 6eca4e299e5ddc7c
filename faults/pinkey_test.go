package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	gimages "github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// publishAs pushes an engine under host/REPO/ENGINE:VERSION whose metadata
// names engine:version: another source claiming the same key.
func publishAs(t *testing.T, host, repo, engine, version string, vs ...sandbox.EngineVariant) string {
	t.Helper()
	return sandbox.MustPublishEngineAs(t, host+"/"+repo+"/"+engine, engine, version, vs...)
}

// publishRepo pushes an engine under repo:VERSION (repo = host/path, its
// last element anything) whose metadata names engine:version.
func publishRepo(t *testing.T, repo, engine, version string, vs ...sandbox.EngineVariant) string {
	t.Helper()
	return sandbox.MustPublishEngineAs(t, repo, engine, version, vs...)
}

// childOf is the first variant's repo@sha256 reference.
func childOf(ctx context.Context, ref string) (string, error) {
	set, err := (&gimages.Resolver{}).Resolve(ctx, ref)
	if err != nil {
		return "", err
	}
	return set.Variants[0].Ref, nil
}

func labelsOf(t *testing.T, rt *containerd.Runtime, name string) map[string]string {
	t.Helper()
	img, err := rt.Client().ImageService().Get(testenv.Context(rt), name)
	if err != nil {
		t.Fatal(err)
	}
	return img.Labels
}

// An image's metadata never decides whose pin it is: a third party's image
// annotated with another engine's name and version does not displace its
// pin, and says why, naming both sources. A want that names the key itself
// may move it, on purpose.
func TestSimulatedAnotherSourceCannotTakeAPin(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	good := publishAs(t, reg.Host, "good", "demo", "1.0", cu129)
	third := publishAs(t, reg.Host, "thirdparty", "demo", "1.0", cu129)
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0)

	first := p.Provision(ctx, provision.Want{Ref: good})
	mustReady(t, first)
	before := labelsOf(t, rt, first.Pinned)

	st := p.Provision(ctx, provision.Want{Ref: third})
	if st.State != provision.Failed || !errors.Is(st.Err, provision.ErrConflict) {
		t.Fatalf("third party: %s (err %v); want a conflict", st, st.Err)
	}
	if st.Conflict == nil || st.Conflict.Held != good || st.Conflict.Claimed != third {
		t.Fatalf("conflict %+v; want held %s, claimed %s", st.Conflict, good, third)
	}
	for _, s := range []string{good, third, "unpin demo:1.0"} {
		if !strings.Contains(st.Detail, s) {
			t.Errorf("detail lacks %q: %s", s, st.Detail)
		}
	}
	if len(st.Attempts) != 0 {
		t.Errorf("refused after pulling: attempts %+v", st.Attempts)
	}
	pin, err := rt.GetPin(ctx, "demo:1.0")
	if err != nil || pin == nil || pin.Source != good || pin.Ref != first.Pinned {
		t.Fatalf("pin after the claim: %+v %v", pin, err)
	}
	if after := labelsOf(t, rt, first.Pinned); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the pin's labels changed:\n%v\n%v", before, after)
	}
	// plan says so in advance.
	pl, err := p.Plan(ctx, provision.Want{Ref: third})
	if err != nil || pl.Outcome != provision.OutcomeConflict {
		t.Fatalf("plan: %+v %v", pl, err)
	}

	// Named in the want, the key moves to the new source.
	moved := p.Provision(ctx, provision.Want{Engine: "demo", Version: "1.0", Ref: third})
	mustReady(t, moved)
	if pin, _ := rt.GetPin(ctx, "demo:1.0"); pin == nil || pin.Source != third {
		t.Fatalf("pin after the named takeover: %+v", pin)
	}
}

// Two wants claiming one key in one agent do not take turns with the pin:
// the first keeps it, the second is refused every time.
func TestSimulatedTwoWantsOneKeyDoNotAlternate(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	a := publishAs(t, reg.Host, "a", "demo", "1.0", cu129)
	b := publishAs(t, reg.Host, "b", "demo", "1.0", cu129)
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0)
	wants := []provision.Want{{Ref: a}, {Ref: b}}
	var pinned string
	for round := 0; round < 4; round++ {
		sts := p.Converge(ctx, wants)
		ready := 0
		for _, st := range sts {
			switch {
			case st.State == provision.Ready:
				ready++
				if pinned == "" {
					pinned = st.Pinned
				}
				if st.Pinned != pinned {
					t.Fatalf("round %d: the pin moved from %s to %s", round, pinned, st.Pinned)
				}
			case !errors.Is(st.Err, provision.ErrConflict):
				t.Fatalf("round %d: %s: want ready or a conflict", round, st)
			}
		}
		if ready != 1 {
			t.Fatalf("round %d: %d ready: %v", round, ready, sts)
		}
	}
}

// Two provisions of one key from different sources at once, in different
// processes (separate provisioners sharing a lock directory): never both
// ready with no pin left. Each round ends with exactly one pin of the key,
// from the source that was reported ready. The sources' repositories end
// in different names (demo, other), so only a lock by the pin key, not
// one by the repository's last element, serialises them.
func TestSimulatedConcurrentClaimsLeaveOnePin(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	a := publishRepo(t, reg.Host+"/a/demo", "demo", "1.0", cu129)
	b := publishRepo(t, reg.Host+"/b/other", "demo", "1.0", cu129)
	lockDir := t.TempDir()
	mk := func() *provision.Provisioner {
		return testenv.Provisioner(t, rt, provision.WithNode(testenv.NewNode(h100("580.82.07"))), provision.WithOverrides(provision.NoOverrides()),
			provision.WithLockDir(lockDir), provision.WithProbeDir(t.TempDir()))
	}
	for round := 0; round < 6; round++ {
		// Named wants, so either may move the key: the race is the pin step.
		wants := []provision.Want{{Engine: "demo", Version: "1.0", Ref: a}, {Engine: "demo", Version: "1.0", Ref: b}}
		if round%2 == 1 {
			wants = []provision.Want{{Ref: a}, {Ref: b}} // and claims by metadata
		}
		var wg sync.WaitGroup
		sts := make([]provision.Status, 2)
		for i := range wants {
			wg.Add(1)
			go func() { defer wg.Done(); sts[i] = mk().Provision(ctx, wants[i]) }()
		}
		wg.Wait()
		pins, err := rt.Pins(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var of []containerd.Pin
		for _, pin := range pins {
			if pin.Key == "demo:1.0" {
				of = append(of, pin)
			}
		}
		if len(of) != 1 {
			t.Fatalf("round %d: %d pins of demo:1.0 (%v); statuses %v", round, len(of), of, sts)
		}
		imgs, _ := rt.Client().ImageService().List(testenv.Context(rt), fmt.Sprintf(`labels.%q==%q`, containerd.LabelPin, "demo:1.0"))
		if len(imgs) != 1 {
			t.Fatalf("round %d: %d records labelled the pin of demo:1.0", round, len(imgs))
		}
		last := false
		for _, st := range sts {
			if st.State == provision.Ready && st.Pinned == of[0].Ref {
				last = true
			}
			if st.State != provision.Ready && !errors.Is(st.Err, provision.ErrConflict) {
				t.Fatalf("round %d: %s", round, st)
			}
			if round%2 == 1 && st.State != provision.Ready && len(st.Attempts) != 0 {
				// Under the key's lock the claim waits, then finds the
				// pin: it is refused before anything is pulled.
				t.Fatalf("round %d: the refused claim pulled while the other held the key: %+v", round, st.Attempts)
			}
		}
		if !last {
			t.Fatalf("round %d: the pin %s is nobody's ready status: %v", round, of[0].Ref, sts)
		}
		if _, err := rt.Unpin(ctx, "demo:1.0"); err != nil {
			t.Fatal(err)
		}
	}
}

// A pin step that finds the key taken by a provision in another lock
// directory (it passed the check before the other pinned) is a conflict
// naming the holder, and no further candidate is pulled or probed: the
// candidate loop stops at the first refusal.
func TestSimulatedPinRaceAcrossLockDirsIsAConflict(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		first provision.Want // pins while the second is being probed
	}{
		{"holder claimed by metadata", provision.Want{}},
		{"holder named in its want", provision.Want{Engine: "demo", Version: "1.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			a := publishAs(t, reg.Host, "a", "demo", "1.0", testenv.CU13, cu129)
			b := publishAs(t, reg.Host, "b", "demo", "1.0", testenv.CU13, cu129)
			mk := func(opts ...provision.Option) *provision.Provisioner {
				return testenv.Provisioner(t, rt, append([]provision.Option{provision.WithNode(testenv.NewNode(h100("580.82.07"))),
					provision.WithOverrides(provision.NoOverrides()), provision.WithLockDir(t.TempDir()), provision.WithProbeDir(t.TempDir())}, opts...)...)
			}
			first := tc.first
			first.Ref = a
			var held provision.Status
			probing := 0
			second := mk(provision.WithOnState(func(st provision.Status) {
				if st.State == provision.Probing {
					if probing++; probing == 1 {
						// The first provision pins the key while the second
						// one's candidate is being probed.
						held = mk().Provision(ctx, first)
					}
				}
			}))
			st := second.Provision(ctx, provision.Want{Ref: b})
			mustReady(t, held)
			if st.State != provision.Failed || !errors.Is(st.Err, provision.ErrConflict) || !errors.Is(st.Err, containerd.ErrHeld) {
				t.Fatalf("second: %s (err %v); want a conflict", st, st.Err)
			}
			if st.Conflict == nil || st.Conflict.Held != a || st.Conflict.Claimed != b || st.Conflict.HeldRef != held.Pinned || !st.Conflict.Race {
				t.Fatalf("conflict %+v; want held %s (%s), claimed %s", st.Conflict, a, held.Pinned, b)
			}
			if len(st.Attempts) != 1 || st.Attempts[0].Stage != "pin" || probing != 1 {
				t.Fatalf("attempts %+v, %d probes; want the first candidate refused at pin and no other tried", st.Attempts, probing)
			}
			if !strings.Contains(st.Detail, "unpin demo:1.0") {
				t.Errorf("detail does not say what to do: %s", st.Detail)
			}
			if pin, err := rt.PinToRun(ctx, "demo:1.0"); err != nil || pin.Ref != held.Pinned {
				t.Fatalf("pin after the race: %+v, %v; want %s", pin, err, held.Pinned)
			}
		})
	}
}

// SetPin itself is safe against a concurrent one of the same key, for
// callers that share no lock: exactly one record ends up the pin.
func TestConcurrentSetPinLeavesOnePin(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	a := publishAs(t, reg.Host, "a", "demo", "1.0", cu129)
	b := publishAs(t, reg.Host, "b", "demo", "1.0", cu129)
	var refs []string
	for _, ref := range []string{a, b} {
		child, err := childOf(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		pulled, err := rt.Pull(ctx, child, containerd.PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, pulled.Name)
	}
	for round := 0; round < 20; round++ {
		var wg sync.WaitGroup
		for i, ref := range refs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rt.SetPin(ctx, containerd.Pin{Key: "demo:1.0", Ref: ref, Source: []string{a, b}[i], Variant: "cu129", Override: "auto"},
					containerd.SetPinOptions{Takeover: true})
			}()
		}
		wg.Wait()
		imgs, _ := rt.Client().ImageService().List(testenv.Context(rt), fmt.Sprintf(`labels.%q==%q`, containerd.LabelPin, "demo:1.0"))
		if len(imgs) != 1 {
			t.Fatalf("round %d: %d records are the pin", round, len(imgs))
		}
	}
}

// A record whose target was changed outside gpupin is not a pin: pins says
// so, provision does not answer from it, run does not start it, gc removes
// it, and a provision after gc proves the image again.
func TestSimulatedRepointedPinIsTampered(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := publish(t, reg, "demo", cu129)
	other := publish(t, reg, "other", cu129)
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0)
	st := p.Provision(ctx, provision.Want{Ref: ref})
	mustReady(t, st)
	o := p.Provision(ctx, provision.Want{Ref: other})
	mustReady(t, o)

	is := rt.Client().ImageService()
	rec, err := is.Get(testenv.Context(rt), st.Pinned)
	if err != nil {
		t.Fatal(err)
	}
	otherRec, err := is.Get(testenv.Context(rt), o.Pinned)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Target.Digest == otherRec.Target.Digest {
		t.Fatal("the two test images are the same image")
	}
	rec.Target = otherRec.Target // labels kept
	if _, err := is.Update(testenv.Context(rt), rec, "target"); err != nil {
		t.Fatal(err)
	}

	pins, err := rt.Pins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, pin := range pins {
		if pin.Ref == st.Pinned {
			found = true
			if !pin.Tampered {
				t.Errorf("pins shows the repointed record as a pin: %+v", pin)
			}
		}
	}
	if !found {
		t.Error("pins does not show the repointed record at all")
	}
	if _, err := rt.GetPin(ctx, "demo:1.0"); !errors.Is(err, containerd.ErrTampered) {
		t.Fatalf("GetPin: %v; want ErrTampered", err)
	}
	// What `gpupin run` looks a target up with: by key, reference or
	// source, the tampered record is refused, and errors.Is sees it from
	// either package.
	for _, target := range []string{"demo:1.0", st.Pinned, ref} {
		pin, err := rt.PinToRun(ctx, target)
		if !errors.Is(err, containerd.ErrTampered) || !errors.Is(err, provision.ErrTampered) || pin != nil {
			t.Fatalf("PinToRun(%s) = %+v, %v; want ErrTampered", target, pin, err)
		}
	}
	if pin, err := rt.PinToRun(ctx, "other:1.0"); err != nil || pin == nil || pin.Ref != o.Pinned {
		t.Fatalf("PinToRun(other:1.0) = %+v, %v; want the other engine's pin", pin, err)
	}
	// And Run itself refuses the record, whoever looked it up.
	if _, err := rt.Run(ctx, containerd.RunSpec{Image: st.Pinned, Args: []string{"true"}, Role: "replica"}); !errors.Is(err, containerd.ErrTampered) {
		t.Fatalf("Run of the repointed record: %v; want ErrTampered", err)
	}
	again := p.Provision(ctx, provision.Want{Ref: ref})
	if again.FromPin || again.State == provision.Ready {
		t.Fatalf("provision answered from a tampered record: %s", again)
	}
	if !strings.Contains(again.Detail, "gc") {
		t.Errorf("the failure does not say what to do: %s", again.Detail)
	}
	got, err := rt.GC(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got.Removed, st.Pinned) {
		t.Fatalf("gc kept the tampered record: %+v", got)
	}
	if _, err := is.Get(testenv.Context(rt), o.Pinned); err != nil {
		t.Fatalf("gc took the other engine's pin: %v", err)
	}
	mustReady(t, p.Provision(ctx, provision.Want{Ref: ref}))
	if pin, err := rt.GetPin(ctx, "demo:1.0"); err != nil || pin == nil || pin.Tampered {
		t.Fatalf("after gc and a new provision: %+v %v", pin, err)
	}
}

// A tampered record is no pin, yet it holds its key against another
// source's metadata until an operator unpins it: the claim is refused with
// a reason that says so, and after unpin the claim goes through.
func TestSimulatedTamperedRecordHoldsItsKey(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	good := publishAs(t, reg.Host, "good", "demo", "1.0", cu129)
	third := publishAs(t, reg.Host, "thirdparty", "demo", "1.0", cu129)
	other := publish(t, reg, "other", cu129)
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0)
	st := p.Provision(ctx, provision.Want{Ref: good})
	mustReady(t, st)
	o := p.Provision(ctx, provision.Want{Ref: other})
	mustReady(t, o)
	is := rt.Client().ImageService()
	rec, err := is.Get(testenv.Context(rt), st.Pinned)
	if err != nil {
		t.Fatal(err)
	}
	otherRec, err := is.Get(testenv.Context(rt), o.Pinned)
	if err != nil {
		t.Fatal(err)
	}
	rec.Target = otherRec.Target
	if _, err := is.Update(testenv.Context(rt), rec, "target"); err != nil {
		t.Fatal(err)
	}

	claim := p.Provision(ctx, provision.Want{Ref: third})
	if claim.State != provision.Failed || !errors.Is(claim.Err, provision.ErrConflict) || claim.Conflict == nil || !claim.Conflict.Tampered {
		t.Fatalf("claim on a key held by a tampered record: %s (conflict %+v); want a conflict", claim, claim.Conflict)
	}
	if claim.Conflict.Held != good || claim.Conflict.HeldRef != st.Pinned || claim.Conflict.Claimed != third {
		t.Fatalf("conflict %+v; want held %s (%s), claimed %s", claim.Conflict, good, st.Pinned, third)
	}
	for _, s := range []string{"changed outside gpupin", "until an operator unpins", "gpupin unpin demo:1.0", good, third} {
		if !strings.Contains(claim.Detail, s) {
			t.Errorf("detail lacks %q: %s", s, claim.Detail)
		}
	}
	if len(claim.Attempts) != 0 {
		t.Errorf("refused only after pulling: %+v", claim.Attempts)
	}
	if pl, err := p.Plan(ctx, provision.Want{Ref: third}); err != nil || pl.Outcome != provision.OutcomeConflict {
		t.Fatalf("plan of the claim: %+v, %v; want a conflict", pl, err)
	}
	if l := labelsOf(t, rt, st.Pinned); l[containerd.LabelPin] != "demo:1.0" {
		t.Fatalf("the tampered record lost its key: %v", l)
	}

	// The operator unpins: the key is free, and the claim goes through.
	if _, err := rt.Unpin(ctx, "demo:1.0"); err != nil {
		t.Fatal(err)
	}
	mustReady(t, p.Provision(ctx, provision.Want{Ref: third}))
	if pin, err := rt.PinToRun(ctx, "demo:1.0"); err != nil || pin.Source != third {
		t.Fatalf("after unpin: %+v, %v; want the pin from %s", pin, err, third)
	}
}
