package provision_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

// recorder keeps what a Loop reports.
type recorder struct {
	mu      sync.Mutex
	changes []provision.Status
	results []provision.Status
}

func (r *recorder) change(st provision.Status) {
	r.mu.Lock()
	r.changes = append(r.changes, st)
	r.mu.Unlock()
}

func (r *recorder) result(st provision.Status) {
	r.mu.Lock()
	r.results = append(r.results, st)
	r.mu.Unlock()
}

func (r *recorder) nChanges() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.changes) }
func (r *recorder) nResults() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.results) }

// changesSince are the changes reported after the first n.
func (r *recorder) changesSince(n int) []provision.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]provision.Status(nil), r.changes[n:]...)
}

func (r *recorder) lastResult() provision.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.results) == 0 {
		return provision.Status{}
	}
	return r.results[len(r.results)-1]
}

// last is the latest change that satisfies ok.
func (r *recorder) last(t *testing.T, what string, ok func(provision.Status) bool) provision.Status {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.changes) - 1; i >= 0; i-- {
		if ok(r.changes[i]) {
			return r.changes[i]
		}
	}
	t.Fatalf("no %s reported; changes: %v", what, r.snapshotLocked())
	return provision.Status{}
}

func (r *recorder) snapshotLocked() []string {
	var out []string
	for _, s := range r.changes {
		out = append(out, s.String())
	}
	return out
}

func stateIs(states ...provision.State) func(provision.Status) bool {
	return func(st provision.Status) bool {
		for _, s := range states {
			if st.State == s {
				return true
			}
		}
		return false
	}
}

type loopEnv struct {
	*env
	o    *outside
	loop *provision.Loop
	rec  *recorder
}

// runLoop runs test in a synctest bubble, with a Loop over a simulated
// node on the test's containerd and registry (reached through outside).
// In the bubble time is the bubble's: it moves only when every goroutine
// in it waits on it, so a provision (which waits on containerd) takes no
// time, synctest.Wait settles the loop, and time.Sleep(d) brings exactly
// what is due d later.
func runLoop(t *testing.T, e *env, lo provision.LoopOptions, test func(t *testing.T, le *loopEnv)) {
	o := newOutside(t)
	synctest.Test(t, func(t *testing.T) {
		le := &loopEnv{env: e, o: o, rec: &recorder{}}
		rt := outsideRuntime{rt: e.rt, o: o}
		resolver := outsideResolver{r: &images.Resolver{Remote: e.rt.Registry()}, o: o}
		e.p = testenv.Provisioner(t, rt, testOptions(t, e.node, provision.WithOverrides(provision.NewOverrides()), provision.WithResolver(resolver))...)
		lo.OnChange, lo.OnResult = le.rec.change, le.rec.result
		le.loop = provision.NewLoop(e.p, lo)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { le.loop.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		synctest.Wait() // idle with nothing wanted
		test(t, le)
	})
}

// publish publishes the demo engine again, from outside the bubble.
func (le *loopEnv) publish(t *testing.T, engine string, variants ...sandbox.EngineVariant) {
	t.Helper()
	var err error
	le.o.do(func() { _, err = sandbox.PublishEngine(context.Background(), le.reg.Host, engine, "1.0", variants) })
	if err != nil {
		t.Fatal(err)
	}
}

// pin reads key's pin from containerd, from outside the bubble.
func (le *loopEnv) pin(t *testing.T, key string) *containerd.Pin {
	t.Helper()
	var (
		pin *containerd.Pin
		err error
	)
	le.o.do(func() { pin, err = le.rt.GetPin(context.Background(), key) })
	if err != nil {
		t.Fatal(err)
	}
	return pin
}

// step lets d pass and the loop settle, and returns the provisions that
// finished meanwhile.
func (le *loopEnv) step(d time.Duration) []provision.Status {
	before := le.rec.nResults()
	time.Sleep(d)
	synctest.Wait()
	le.rec.mu.Lock()
	defer le.rec.mu.Unlock()
	return append([]provision.Status(nil), le.rec.results[before:]...)
}

func TestLoopSimulatedWantChangeProvisionsAtOnce(t *testing.T) {
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	runLoop(t, e, provision.LoopOptions{}, func(t *testing.T, le *loopEnv) {
		start := time.Now()
		if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		// The bubble's clock moves only when the loop waits on it: it did
		// not move from the want to the pin, so no tick was waited for.
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the want was acted on after %s: a tick was waited for", waited)
		}
		st := le.rec.last(t, "ready", stateIs(provision.Ready, provision.Failed))
		if st.State != provision.Ready || st.Variant != "cu129" || st.Key != "demo:1.0" {
			t.Fatalf("status %s", st)
		}
		// Each change is reported once: pending, resolving, pulling, probing, ready.
		var states []provision.State
		for _, c := range le.rec.changesSince(0) {
			states = append(states, c.State)
		}
		if want := []provision.State{provision.Pending, provision.Resolving, provision.Pulling, provision.Probing, provision.Ready}; !slices.Equal(states, want) {
			t.Errorf("reported states %v, want %v", states, want)
		}

		// A second engine wanted beside it: started at once too.
		le.publish(t, "other", cu129)
		start, seen := time.Now(), le.rec.nChanges()
		if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}, {Ref: e.reg.Host + "/other:1.0"}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the second want was acted on after %s", waited)
		}
		var other []provision.State
		for _, c := range le.rec.changesSince(seen) {
			if c.Engine == "other" {
				other = append(other, c.State)
			}
		}
		if !slices.Contains(other, provision.Pulling) || other[len(other)-1] != provision.Ready {
			t.Fatalf("the second engine's states %v; want pulling, then ready", other)
		}

		// No longer wanted: no longer reported, and the pin stays until gc.
		if err := le.loop.SetWants([]provision.Want{{Ref: e.reg.Host + "/other:1.0"}}); err != nil {
			t.Fatal(err)
		}
		sts := le.loop.Status()
		if len(sts) != 1 || sts[0].Engine != "other" {
			t.Fatalf("status after dropping demo: %v", sts)
		}
		if pin := le.pin(t, "demo:1.0"); pin == nil {
			t.Fatal("the pin of an engine no longer wanted was not kept")
		}

		// Bad wants are refused whole, and change nothing.
		for _, tc := range []struct {
			wants   []provision.Want
			invalid bool // a want itself is malformed
		}{
			{[]provision.Want{{Ref: "reg.example/x:"}}, true},
			{[]provision.Want{{Ref: e.ref, Override: "CU13!"}}, true},
			{[]provision.Want{{Ref: ""}}, true},
			{[]provision.Want{{Ref: e.ref}, {Ref: e.ref}}, false},
		} {
			if err := le.loop.SetWants(tc.wants); err == nil || tc.invalid && !errors.Is(err, provision.ErrInvalidWant) {
				t.Errorf("SetWants(%+v) = %v; want it refused", tc.wants, err)
			}
		}
		if sts := le.loop.Status(); len(sts) != 1 {
			t.Errorf("a refused SetWants changed the wants: %v", sts)
		}
	})
}

func TestLoopSimulatedOverrideChangeTakesEffectAtOnce(t *testing.T) {
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{cu13, cu129})
	runLoop(t, e, provision.LoopOptions{}, func(t *testing.T, le *loopEnv) {
		if err := le.loop.SetWants([]provision.Want{{Engine: "demo", Version: "1.0", Ref: e.ref}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		st := le.rec.last(t, "ready under auto", stateIs(provision.Ready, provision.Failed))
		if st.State != provision.Ready || st.Variant != "cu13" || st.Override != "auto" {
			t.Fatalf("auto: %s (override %s)", st, st.Override)
		}

		steps := []struct {
			override string
			state    provision.State
			variant  string
		}{
			{"cu129", provision.Ready, "cu129"},
			{"none", provision.Disabled, ""},
			{"auto", provision.Ready, "cu13"},
		}
		for _, s := range steps {
			start, seen := time.Now(), le.rec.nChanges()
			if err := le.loop.SetOverrides(map[string]string{"demo": s.override}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if waited := time.Since(start); waited != 0 {
				t.Errorf("override %s was acted on after %s", s.override, waited)
			}
			changes := le.rec.changesSince(seen)
			if len(changes) == 0 {
				t.Fatalf("override %s: no change reported", s.override)
			}
			got := changes[len(changes)-1]
			if got.State != s.state || got.Variant != s.variant || got.Override != s.override {
				t.Fatalf("override %s: %s (variant %q, override %q); want %s %q", s.override, got, got.Variant, got.Override, s.state, s.variant)
			}
		}
		for _, bad := range []map[string]string{{"demo": "reg/x:"}, {"Demo!": "auto"}} {
			if err := le.loop.SetOverrides(bad); err == nil {
				t.Errorf("SetOverrides(%v) was accepted", bad)
			}
		}
	})
}

func TestLoopSimulatedDriverUpgradeReproves(t *testing.T) {
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	runLoop(t, e, provision.LoopOptions{NodeCheck: time.Minute}, func(t *testing.T, le *loopEnv) {
		if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		before := le.rec.lastResult()
		if before.State != provision.Ready || before.Variant != "cu129" {
			t.Fatalf("before: %s", before)
		}

		// The driver is upgraded under the running loop; the next read of
		// the node, a minute on, sees it, and the pin is proved again.
		upgraded := h100("580.82.07", "13.0")
		e.node.Set(upgraded)
		ran := le.step(time.Minute)
		if len(ran) != 1 {
			t.Fatalf("%d provisions in the minute after the upgrade, want 1", len(ran))
		}
		st := ran[0]
		if st.State != provision.Ready || st.FromPin || st.Variant != "cu13" {
			t.Fatalf("after the upgrade: %s (from pin %v)", st, st.FromPin)
		}
		if at := st.At.Sub(before.At); at != time.Minute {
			t.Errorf("re-proved %s after the last pass, want at the node check a minute on", at)
		}
		if st.Pin == nil || st.Pin.Node != upgraded.Fingerprint() {
			t.Fatalf("the new pin is not under the new fingerprint: %+v", st.Pin)
		}
		pin := le.pin(t, "demo:1.0")
		if pin == nil || pin.Node != upgraded.Fingerprint() || pin.Variant != "cu13" {
			t.Fatalf("pin in containerd: %+v", pin)
		}
	})
}

func TestLoopSimulatedFailingProbeBacksOff(t *testing.T) {
	bad := cu129
	bad.SimProbe = "fail"
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{bad})
	// Only the engine's own schedule wakes the loop: the node is read at
	// each wake, and on its own only hourly.
	runLoop(t, e, provision.LoopOptions{RetryMin: time.Minute, Recheck: 10 * time.Minute, NodeCheck: time.Hour}, func(t *testing.T, le *loopEnv) {
		if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := le.rec.lastResult(); st.State != provision.Failed || !errors.Is(st.Err, provision.ErrAllFailed) {
			t.Fatalf("first pass: %s (err %v)", st, st.Err)
		}

		// retry lets d pass and checks that exactly one provision ran, d
		// after the one before it: not sooner, not later.
		retry := func(what string, d time.Duration, state provision.State) {
			t.Helper()
			prev := le.rec.lastResult()
			if early := le.step(d - time.Nanosecond); len(early) != 0 {
				t.Fatalf("%s: ran %s after the pass before, sooner than %s", what, early[0].At.Sub(prev.At), d)
			}
			ran := le.step(time.Nanosecond)
			if len(ran) != 1 {
				t.Fatalf("%s: %d provisions %s after the pass before, want 1", what, len(ran), d)
			}
			if at := ran[0].At.Sub(prev.At); at != d || ran[0].State != state {
				t.Fatalf("%s: %s %s after the pass before; want %s after %s", what, ran[0], at, state, d)
			}
		}
		want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
		for i, d := range want {
			retry(fmt.Sprintf("retry %d", i+1), d, provision.Failed)
		}
		// Reported once, not once per retry.
		n := 0
		for _, c := range le.rec.changesSince(0) {
			if c.State == provision.Failed {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the same failure was reported %d times", n)
		}

		// A good build under the tag: the next retry pins it, and a ready
		// engine is next looked at after the re-check interval.
		le.publish(t, "demo", cu129)
		retry("the retry after the fix", 10*time.Minute, provision.Ready)
		retry("the re-check after the fix", 10*time.Minute, provision.Ready)

		// The backoff starts over after the success: a failure now (a
		// driver upgrade, and builds that fail) is retried after 1m again.
		bad13 := cu13
		bad13.SimProbe = "fail"
		bad.Env = []string{"REBUILT=1"}
		le.publish(t, "demo", bad13, bad)
		before := le.rec.nResults()
		e.node.Set(h100("580.82.07", "13.0"))
		le.loop.Kick()
		synctest.Wait()
		if n := le.rec.nResults() - before; n != 1 || le.rec.lastResult().State != provision.Failed {
			t.Fatalf("%d provisions after the upgrade, the last %s; want 1, failed", n, le.rec.lastResult())
		}
		retry("the first retry after a success", time.Minute, provision.Failed)
	})
}

func TestLoopSimulatedRegistryDownKeepsReady(t *testing.T) {
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	runLoop(t, e, provision.LoopOptions{Recheck: 10 * time.Minute, NodeCheck: time.Hour}, func(t *testing.T, le *loopEnv) {
		if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		ready := le.rec.lastResult()
		if ready.State != provision.Ready {
			t.Fatalf("%s", ready)
		}
		e.reg.SetDown(true)
		e.reg.Reset()
		seen := le.rec.nChanges()
		for i := range 3 {
			ran := le.step(10 * time.Minute)
			if len(ran) != 1 {
				t.Fatalf("re-check %d: %d provisions in its 10 minutes, want 1", i+1, len(ran))
			}
			if st := ran[0]; st.State != provision.Ready || !st.FromPin || st.Pinned != ready.Pinned {
				t.Fatalf("re-check %d with the registry down: %s", i+1, st)
			}
		}
		if n := len(e.reg.Requests()); n != 0 {
			t.Errorf("re-checks of a ready engine asked the registry %d times", n)
		}
		// The pin's detail wording changes once (fresh → from the pin); no
		// state other than ready is ever reported.
		changes := le.rec.changesSince(seen)
		for _, c := range changes {
			if c.State != provision.Ready {
				t.Errorf("reported %s while the registry was down", c)
			}
		}
		if len(changes) > 1 {
			t.Errorf("%d changes reported by three identical re-checks", len(changes))
		}
	})
}

// The fast tier: a failing engine is retried after RetryMin, doubling up
// to the re-check interval, on memrt.Runtime in a bubble of its own.
func TestLoopBackoffSimulated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := memrt.EngineSet(demoRef, "demo", "1.0")
		failing := memrt.VerdictLine(probe.Verdict{OK: false, Devices: []probe.Device{}})
		m := memrt.New()
		m.SetProbe(set.Variants[0].Ref, failing, 0)
		m.SetProbe(set.Variants[1].Ref, failing, 0)
		rec := &recorder{}
		p := memProvisioner(t, m, memrt.Resolver{demoRef: set}, h100("580.82.07", "13.0"))
		loop := provision.NewLoop(p, provision.LoopOptions{RetryMin: time.Minute, Recheck: 10 * time.Minute, NodeCheck: time.Hour,
			OnChange: rec.change, OnResult: rec.result})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { loop.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		if err := loop.SetWants([]provision.Want{{Ref: demoRef}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := rec.lastResult(); st.State != provision.Failed {
			t.Fatalf("first pass: %s", st)
		}
		var gaps []time.Duration
		for i := range 6 {
			before, at := rec.nResults(), rec.lastResult().At
			for waited := time.Duration(0); rec.nResults() == before; waited += time.Second {
				if waited > 11*time.Minute {
					t.Fatalf("retry %d: none within %s of the failure before (retries so far after %v)", i+1, waited, gaps)
				}
				time.Sleep(time.Second)
				synctest.Wait()
			}
			gaps = append(gaps, rec.lastResult().At.Sub(at).Round(time.Second))
		}
		want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
		if !slices.Equal(gaps, want) {
			t.Fatalf("retries after %v, want %v", gaps, want)
		}
		// A fix is picked up at the next retry, and the engine is then
		// looked at again only at the re-check.
		m.SetProbe(set.Variants[0].Ref, memrt.Passing(), 0) // as if never set: the default verdict
		before := rec.nResults()
		time.Sleep(10*time.Minute + time.Second)
		synctest.Wait()
		if n := rec.nResults() - before; n != 1 || rec.lastResult().State != provision.Ready {
			t.Fatalf("%d provisions in the 10m after the fix, the last %s; want 1, ready", n, rec.lastResult())
		}
	})
}
