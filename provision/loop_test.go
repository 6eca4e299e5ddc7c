package provision_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/provision"
)

// fakeClock is moved by hand: a backoff of minutes is checked in no time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]bool
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), timers: map[*fakeTimer]bool{}}
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) NewTimer(d time.Duration) provision.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
		return t
	}
	c.timers[t] = true
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	active := t.c.timers[t]
	delete(t.c.timers, t)
	return active
}

// advance sets the time and fires every timer that is due.
func (c *fakeClock) advance(to time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = to
	for t := range c.timers {
		if !t.at.After(to) {
			t.ch <- to
			delete(c.timers, t)
		}
	}
}

// next is the earliest armed timer, and how many are armed.
func (c *fakeClock) next() (time.Time, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	for t := range c.timers {
		if at.IsZero() || t.at.Before(at) {
			at = t.at
		}
	}
	return at, len(c.timers)
}

// recorder keeps what a Loop reports.
type recorder struct {
	mu      sync.Mutex
	changes []provision.Status
	results []provision.Status
	ch      chan provision.Status
}

func newRecorder() *recorder { return &recorder{ch: make(chan provision.Status, 1000)} }

func (r *recorder) change(st provision.Status) {
	r.mu.Lock()
	r.changes = append(r.changes, st)
	r.mu.Unlock()
	r.ch <- st
}

func (r *recorder) result(st provision.Status) {
	r.mu.Lock()
	r.results = append(r.results, st)
	r.mu.Unlock()
}

// drain forgets the changes not yet awaited.
func (r *recorder) drain() {
	for {
		select {
		case <-r.ch:
		default:
			return
		}
	}
}

func (r *recorder) nResults() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.results) }

func (r *recorder) lastResult() provision.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.results[len(r.results)-1]
}

// await waits for a reported status that satisfies ok.
func (r *recorder) await(t *testing.T, within time.Duration, what string, ok func(provision.Status) bool) provision.Status {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case st := <-r.ch:
			if ok(st) {
				return st
			}
		case <-deadline:
			t.Fatalf("no %s reported within %s; changes: %v", what, within, r.snapshot())
			return provision.Status{}
		}
	}
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
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
	loop *provision.Loop
	rec  *recorder
	clk  *fakeClock
}

// startLoop runs a Loop over a simulated node on the test's containerd and
// registry, with a clock the test moves.
func startLoop(t *testing.T, e *env, lo provision.LoopOptions) *loopEnv {
	t.Helper()
	le := &loopEnv{env: e, rec: newRecorder(), clk: newFakeClock()}
	e.p = provision.New(e.rt, testOptions(t, e.node, provision.WithOverrides(provision.NewOverrides()), provision.WithClock(le.clk.Now))...)
	lo.Clock, lo.OnChange, lo.OnResult = le.clk, le.rec.change, le.rec.result
	le.loop = provision.NewLoop(e.p, lo)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { le.loop.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the loop did not stop within 30s of its context ending")
		}
	})
	return le
}

// settle waits until the loop has nothing running and waits on its timer.
func (le *loopEnv) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, n := le.clk.next(); n == 1 && le.loop.InFlight() == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the loop did not settle; in flight %d", le.loop.InFlight())
}

func TestLoopSimulatedWantChangeProvisionsAtOnce(t *testing.T) {
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	le := startLoop(t, e, provision.LoopOptions{})
	le.settle(t) // idle with nothing wanted: the next step is the want alone

	start := time.Now()
	if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
		t.Fatal(err)
	}
	// The fake clock stands still: reaching pulling needed no tick.
	le.rec.await(t, 30*time.Second, "pulling without waiting for a tick", stateIs(provision.Pulling))
	t.Logf("pulling %s after the want", time.Since(start))
	st := le.rec.await(t, 30*time.Second, "ready", stateIs(provision.Ready, provision.Failed))
	if st.State != provision.Ready || st.Variant != "cu129" || st.Key != "demo:1.0" {
		t.Fatalf("status %s", st)
	}
	// Each change is reported once: pending, pulling, probing, ready.
	var states []provision.State
	for _, c := range le.rec.changes {
		states = append(states, c.State)
	}
	if want := []provision.State{provision.Pending, provision.Resolving, provision.Pulling, provision.Probing, provision.Ready}; !equalStates(states, want) {
		t.Errorf("reported states %v, want %v", states, want)
	}

	// A second engine wanted beside it: started at once too.
	if _, err := sandbox.PublishEngine(context.Background(), e.reg.Host, "other", "2.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}, {Ref: e.reg.Host + "/other:2.0"}}); err != nil {
		t.Fatal(err)
	}
	le.rec.await(t, 30*time.Second, "the second engine pulling", func(s provision.Status) bool { return s.State == provision.Pulling && s.Engine == "other" })
	t.Logf("second engine pulling %s after the want", time.Since(start))
	le.rec.await(t, 30*time.Second, "the second engine ready", func(s provision.Status) bool { return s.State == provision.Ready && s.Engine == "other" })

	// No longer wanted: no longer reported, and the pin stays until gc.
	if err := le.loop.SetWants([]provision.Want{{Ref: e.reg.Host + "/other:2.0"}}); err != nil {
		t.Fatal(err)
	}
	sts := le.loop.Status()
	if len(sts) != 1 || sts[0].Engine != "other" {
		t.Fatalf("status after dropping demo: %v", sts)
	}
	if pin, err := e.rt.GetPin(context.Background(), "demo:1.0"); err != nil || pin == nil {
		t.Fatalf("the pin of an engine no longer wanted was not kept: %v %v", pin, err)
	}

	// Bad wants are refused whole, and change nothing.
	for _, bad := range [][]provision.Want{
		{{Ref: "reg.example/x:"}},
		{{Ref: e.ref, Override: "CU13!"}},
		{{Ref: e.ref}, {Ref: e.ref}},
		{{Ref: ""}},
	} {
		if err := le.loop.SetWants(bad); err == nil {
			t.Errorf("SetWants(%+v) was accepted", bad)
		}
	}
	if sts := le.loop.Status(); len(sts) != 1 {
		t.Errorf("a refused SetWants changed the wants: %v", sts)
	}
}

func equalStates(a, b []provision.State) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLoopSimulatedOverrideChangeTakesEffectAtOnce(t *testing.T) {
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{cu13, cu129})
	le := startLoop(t, e, provision.LoopOptions{})
	if err := le.loop.SetWants([]provision.Want{{Engine: "demo", Version: "1.0", Ref: e.ref}}); err != nil {
		t.Fatal(err)
	}
	st := le.rec.await(t, 30*time.Second, "ready under auto", stateIs(provision.Ready, provision.Failed))
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
		start := time.Now()
		if err := le.loop.SetOverrides(map[string]string{"demo": s.override}); err != nil {
			t.Fatal(err)
		}
		first := le.rec.await(t, 30*time.Second, "a change after override "+s.override, func(provision.Status) bool { return true })
		t.Logf("override %s acted on %s after the change", s.override, time.Since(start))
		got := first
		if got.State == provision.Resolving || got.State == provision.Pulling || got.State == provision.Probing {
			got = le.rec.await(t, 30*time.Second, "settled after override "+s.override, stateIs(provision.Ready, provision.Failed, provision.Disabled))
		}
		if got.State != s.state || got.Variant != s.variant || got.Override != s.override {
			t.Fatalf("override %s: %s (variant %q, override %q); want %s %q", s.override, got, got.Variant, got.Override, s.state, s.variant)
		}
	}
	if err := le.loop.SetOverrides(map[string]string{"demo": "reg/x:"}); err == nil {
		t.Error("a malformed override was accepted")
	}
	if err := le.loop.SetOverrides(map[string]string{"Demo!": "auto"}); err == nil {
		t.Error("a bad engine name was accepted")
	}
}

func TestLoopSimulatedDriverUpgradeReproves(t *testing.T) {
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	le := startLoop(t, e, provision.LoopOptions{NodeCheck: time.Minute})
	if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
		t.Fatal(err)
	}
	st := le.rec.await(t, 30*time.Second, "ready", stateIs(provision.Ready, provision.Failed))
	if st.State != provision.Ready || st.Variant != "cu129" {
		t.Fatalf("before: %s", st)
	}
	le.settle(t)

	// The driver is upgraded under the running loop; the next read of the
	// node (a minute on) sees it, and the pin is proved again.
	upgraded := h100("580.82.07", "13.0")
	e.node.Set(upgraded)
	le.clk.advance(le.clk.Now().Add(time.Minute))
	st = le.rec.await(t, 30*time.Second, "re-proved", stateIs(provision.Ready, provision.Failed))
	if st.State != provision.Ready || st.FromPin || st.Variant != "cu13" {
		t.Fatalf("after the upgrade: %s (from pin %v)", st, st.FromPin)
	}
	if st.Pin == nil || st.Pin.Node != upgraded.Fingerprint() {
		t.Fatalf("the new pin is not under the new fingerprint: %+v", st.Pin)
	}
	pin, err := e.rt.GetPin(context.Background(), "demo:1.0")
	if err != nil || pin == nil || pin.Node != upgraded.Fingerprint() || pin.Variant != "cu13" {
		t.Fatalf("pin in containerd: %+v %v", pin, err)
	}
}

func TestLoopSimulatedFailingProbeBacksOff(t *testing.T) {
	bad := cu129
	bad.SimProbe = "fail"
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{bad})
	// Only the engine's own schedule arms the clock: the node is read at
	// each wake, and on its own only hourly.
	le := startLoop(t, e, provision.LoopOptions{RetryMin: time.Minute, Recheck: 10 * time.Minute, NodeCheck: time.Hour})
	if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
		t.Fatal(err)
	}
	le.rec.await(t, 30*time.Second, "failed", stateIs(provision.Failed))
	le.settle(t)

	// step moves the clock to the next armed timer and waits for the
	// loop to be idle again; it returns how far the clock moved and
	// whether a provision ran.
	step := func() (time.Duration, bool) {
		t.Helper()
		before, n := le.rec.nResults(), le.clk.Now()
		at, _ := le.clk.next()
		le.clk.advance(at)
		le.settle(t)
		return at.Sub(n), le.rec.nResults() > before
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		d, ran := step()
		if !ran || d != w {
			t.Fatalf("retry %d came %s after the failure before it (ran %v); want %s", i+1, d, ran, w)
		}
		if st := le.rec.lastResult(); st.State != provision.Failed {
			t.Fatalf("retry %d: %s", i+1, st)
		}
	}
	// Reported once, not once per retry.
	n := 0
	for _, c := range le.rec.changes {
		if c.State == provision.Failed {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the same failure was reported %d times", n)
	}

	// A good build under the tag: the next retry pins it, and a ready
	// engine is next looked at after the re-check interval.
	if _, err := sandbox.PublishEngine(context.Background(), e.reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}
	if d, ran := step(); !ran || d != 10*time.Minute || le.rec.lastResult().State != provision.Ready {
		t.Fatalf("after the fix: moved %s, ran %v, %s", d, ran, le.rec.lastResult())
	}
	if at, _ := le.clk.next(); at.Sub(le.clk.Now()) != 10*time.Minute {
		t.Fatalf("after success the next pass is in %s, want the 10m re-check", at.Sub(le.clk.Now()))
	}

	// The backoff starts over after the success: a failure now (a driver
	// upgrade, and builds that fail) is retried after 1m again.
	bad13 := cu13
	bad13.SimProbe = "fail"
	bad.Env = []string{"REBUILT=1"}
	if _, err := sandbox.PublishEngine(context.Background(), e.reg.Host, "demo", "1.0", []sandbox.EngineVariant{bad13, bad}); err != nil {
		t.Fatal(err)
	}
	before := le.rec.nResults()
	le.rec.drain()
	e.node.Set(h100("580.82.07", "13.0"))
	le.loop.Kick()
	le.rec.await(t, 30*time.Second, "failed after the upgrade", stateIs(provision.Failed))
	le.settle(t)
	if le.rec.nResults() != before+1 {
		t.Fatalf("%d provisions after the upgrade, want 1", le.rec.nResults()-before)
	}
	if d, ran := step(); !ran || d != time.Minute {
		t.Fatalf("first retry after a success came %s after the failure (ran %v), want 1m", d, ran)
	}
	if st := le.rec.lastResult(); st.State != provision.Failed {
		t.Fatalf("retry after the upgrade: %s", st)
	}
}

func TestLoopSimulatedRegistryDownKeepsReady(t *testing.T) {
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	le := startLoop(t, e, provision.LoopOptions{Recheck: 10 * time.Minute, NodeCheck: time.Hour})
	if err := le.loop.SetWants([]provision.Want{{Ref: e.ref}}); err != nil {
		t.Fatal(err)
	}
	ready := le.rec.await(t, 30*time.Second, "ready", stateIs(provision.Ready, provision.Failed))
	if ready.State != provision.Ready {
		t.Fatalf("%s", ready)
	}
	le.settle(t)
	e.reg.SetDown(true)
	e.reg.Reset()
	changes := len(le.rec.snapshot())
	for i := 0; i < 3; i++ {
		before := le.rec.nResults()
		at, _ := le.clk.next()
		le.clk.advance(at)
		le.settle(t)
		if le.rec.nResults() != before+1 {
			t.Fatalf("re-check %d did not run", i+1)
		}
		st := le.rec.lastResult()
		if st.State != provision.Ready || !st.FromPin || st.Pinned != ready.Pinned {
			t.Fatalf("re-check %d with the registry down: %s", i+1, st)
		}
	}
	if n := len(e.reg.Requests()); n != 0 {
		t.Errorf("re-checks of a ready engine asked the registry %d times", n)
	}
	// The pin's detail wording changes once (fresh → from the pin); no
	// state other than ready is ever reported.
	for _, c := range le.rec.changes[changes:] {
		if c.State != provision.Ready {
			t.Errorf("reported %s while the registry was down", c)
		}
	}
	if extra := len(le.rec.snapshot()) - changes; extra > 1 {
		t.Errorf("%d changes reported by three identical re-checks", extra)
	}
}
