package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/registry"
)

// Runtime is everything a Provisioner asks of containerd, said in full so
// that a wrapper (a test's, a metrics layer) that lacks a part does not
// compile, rather than silently losing a feature. Each part is declared
// beside the code that uses it; containerd.Runtime is all of them.
type Runtime interface {
	PinReader  // pins.go
	PinWriter  // this file
	Puller     // this file
	Prefetcher // prefetch.go
	Runner     // probe.go
	Sweeper    // loop.go
	// Namespace keeps the pin-key locks of different namespaces apart
	// (lock.go): they are different sets of pins.
	Namespace() string
}

// PinWriter makes a pin, and drops a candidate that did not become one.
type PinWriter interface {
	SetPin(ctx context.Context, p containerd.Pin, opts containerd.SetPinOptions) error
	DiscardCandidate(ctx context.Context, name string) error
}

// Puller pulls candidates by digest under a lease. Registry is the policy
// it reaches registries with: manifests are resolved through the same one,
// so that what is resolved is what is pulled.
type Puller interface {
	WithLease(ctx context.Context, fn func(ctx context.Context) error) error
	Pull(ctx context.Context, ref string, opts containerd.PullOptions) (containerd.Pulled, error)
	Registry() *registry.Policy
}

// Resolver reads a reference down to its variants (images.Resolver). It
// takes the reference parsed: a want's is parsed once, where it enters.
type Resolver interface {
	ResolveReference(ctx context.Context, ref images.Reference) (*images.Set, error)
}

// Provisioner provisions wants on one node.
type Provisioner struct {
	rt Runtime
	// none is a provisioner made without a runtime (New(nil)): rt is
	// absent, and what needs the image as containerd holds it says so.
	none   bool
	opts   config
	flight singleflight.Group
	keys   keyLocks
	// stall is how the registry policy judges a stall (StallBytes in
	// StallTimeout); a pull's status judges it alike.
	stall registry.Config
}

// New makes a Provisioner over a runtime. Its defaults are the CLI's: NVML
// for node facts, the overrides file, the shared lock directory, and
// manifests read through the runtime's registry policy. A nil rt (the
// interface itself) is a provisioner without containerd: Plan and Name
// work, reading no pins, and the rest say there is no runtime. Pass nil
// itself for none: a nil *containerd.Runtime (the variable a failed or
// skipped containerd.Connect leaves) is refused, since it would only fail
// later, at a first call; another implementation's nil pointer is its
// caller's to keep out. An option that refuses its value is New's error.
func New(rt Runtime, opts ...Option) (*Provisioner, error) {
	none := rt == nil
	if none {
		rt = absent{}
	} else if rt == Runtime((*containerd.Runtime)(nil)) {
		return nil, fmt.Errorf("provision: the runtime is a nil %T (connect to containerd first, or pass nil for none)", (*containerd.Runtime)(nil))
	}
	c := defaults()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("provision: %w", err)
		}
	}
	policy := rt.Registry()
	if c.Resolver == nil {
		var remote images.Remote
		if policy != nil {
			remote = policy
		}
		c.Resolver = &images.Resolver{Remote: remote}
	}
	if policy == nil {
		policy = registry.New(registry.Config{}) // its defaults judge stalls
	}
	if c.Node == nil {
		c.Node = node.NewReader()
	}
	if c.Overrides == nil {
		c.Overrides = NoOverrides()
	}
	return &Provisioner{rt: rt, none: none, opts: c, stall: policy.Config()}, nil
}

// Provision brings one want to a pinned, proved image, or says why not.
// Two calls for the same want at once share one piece of work. The same
// key from another reference is another want: it waits for the key's lock
// and then gets its own answer (a conflict, or the pin it finds).
func (p *Provisioner) Provision(ctx context.Context, w Want) Status {
	pw, err := readWant(w)
	if err != nil {
		// Told like any other end: a loop's observer sees it too.
		st := pending(w).fail(err)
		st.At = time.Now()
		p.emit(ctx, st)
		return st
	}
	return p.provisionWant(ctx, pw)
}

// provisionWant is Provision of a want already read (a Loop reads its
// wants once, when they are set).
func (p *Provisioner) provisionWant(ctx context.Context, w want) Status {
	for {
		v, _, shared := p.flight.Do(w.Key()+"\x00"+w.Ref+"\x00"+w.Override, func() (any, error) {
			st := p.provision(ctx, w)
			st.Cancelled = ctx.Err() != nil
			return st, nil
		})
		st := v.(Status)
		if st.Cancelled && shared && ctx.Err() == nil {
			// Joined a flight whose own caller gave up: that is no answer
			// to this caller, who still wants one.
			continue
		}
		return st
	}
}

// Converge provisions every want, two at a time, and returns their
// statuses in the order of wants.
func (p *Provisioner) Converge(ctx context.Context, wants []Want) []Status {
	out := make([]Status, len(wants))
	var g errgroup.Group
	g.SetLimit(2)
	for i, w := range wants {
		g.Go(func() error {
			out[i] = p.Provision(ctx, w)
			return nil
		})
	}
	g.Wait()
	return out
}

// provision plans w, then, under the key's lock, tries its candidates in
// turn: the steps of Provision, each in a function of its own.
func (p *Provisioner) provision(ctx context.Context, w want) (st Status) {
	start := time.Now()
	st = pending(w.Want)
	defer func() {
		st.At = time.Now()
		st.Duration = st.At.Sub(start)
		p.emit(ctx, st)
	}()
	ctx, cancel := context.WithTimeoutCause(ctx, p.opts.Timeout, fmt.Errorf("provision took longer than %s (provision timeout)", p.opts.Timeout))
	defer cancel()
	r, pl, err := p.planProvision(ctx, &st, w)
	if err != nil {
		return st.fail(cause(ctx, err))
	}
	st, done := st.planned(pl)
	if done {
		return st
	}
	// One provision of a key at a time, across wants and processes; under
	// the lock, what another one did meanwhile counts.
	unlock, err := p.lock(ctx, pl.Key)
	if err != nil {
		return st.fail(cause(ctx, err))
	}
	defer unlock()
	if pl, done, st = p.redecide(ctx, st, w, r); done {
		return st
	}
	return p.tryCandidates(ctx, st, pl, w, r)
}

// planProvision reads the node and the pins, and plans w. The status says
// it is resolving only when the registry will be asked: a pin that
// answers is no resolution.
func (p *Provisioner) planProvision(ctx context.Context, st *Status, w want) (*reads, *Plan, error) {
	facts, err := p.opts.Node.Read(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read node facts: %w", err)
	}
	st.Simulated = facts.Simulated
	pins, err := p.rt.Pins(ctx)
	if err != nil {
		return nil, nil, err
	}
	r := &reads{facts: facts, pins: pins}
	pl, err := p.decideReading(ctx, w, r, func() {
		st.State, st.Detail = Resolving, "resolving "+w.Ref
		p.emit(ctx, *st)
	})
	return r, pl, err
}

// redecide reads the pins again and decides again on what was resolved
// already: a pin made meanwhile that answers w ends the provision ready,
// one that now holds the key against it ends it in a conflict. Nothing
// else is read again (an override only for an engine first seen in the
// new pins).
func (p *Provisioner) redecide(ctx context.Context, st Status, w want, r *reads) (*Plan, bool, Status) {
	pins, err := p.rt.Pins(ctx)
	if err != nil {
		return nil, true, st.fail(err)
	}
	r.pins = pins
	pl, err := p.decideReading(ctx, w, r, nil)
	if err != nil {
		return nil, true, st.fail(err)
	}
	if pl.Outcome == OutcomePinned {
		return pl, true, st.ready(*pl.Pinned, true, fmt.Sprintf("pinned %s (%s) by another provision meanwhile", pl.Pinned.Ref, pl.Pinned.Variant))
	}
	st, done := st.planned(pl)
	return pl, done, st
}

// planned takes the plan's naming into the status, and ends the status
// when the plan leaves nothing to try: a pin answers, the node is
// unsupported, the engine disabled, no candidate fits, or the key is
// held from another source.
func (st Status) planned(pl *Plan) (Status, bool) {
	st.Engine, st.Version, st.Key = pl.Engine, pl.Version, pl.Key
	st.Override, st.Rejected = pl.Override, pl.Rejected
	switch pl.Outcome {
	case OutcomePinned:
		return st.ready(*pl.Pinned, true, pl.Detail), true
	case OutcomeUnsupported:
		st.State, st.Detail, st.Err = Unsupported, pl.Detail, pl.Err
		return st, true
	case OutcomeNone:
		st.State, st.Detail, st.Err = Disabled, pl.Detail, pl.Err
		return st, true
	case OutcomeNoCandidate, OutcomeConflict:
		return st.fail(pl.Err), true
	}
	return st, false
}

// tryCandidates tries the plan's candidates in order until one is pinned.
// Auto and an operator's image fall back to the next; a forced variant
// does not, nor does a cancelled provision or a key taken meanwhile.
func (p *Provisioner) tryCandidates(ctx context.Context, st Status, pl *Plan, w want, r *reads) Status {
	cands, canaryDone := p.awaitCanary(ctx, &st, pl) // WithCanary; none: every candidate
	// A canary hands its verdict on once its status is out, after this.
	defer func() { go canaryDone() }()
	tried := *pl
	tried.Candidates = cands
	pf := p.prefetchFor(ctx, &tried, pl.Node.Platform) // WithPrefetch; nil does nothing
	defer pf.close()
	for i, c := range cands {
		pin, verdict, attempt := p.try(pf.turn(ctx, i), &st, pl, c, w)
		if attempt == nil {
			st.Verdict = verdict
			msg := fmt.Sprintf("pinned %s (%s), probe passed", pin.Ref, c.Variant)
			if len(st.Attempts) > 0 {
				msg += " after " + attemptsSummary(st.Attempts)
			}
			return st.ready(pin, false, msg)
		}
		if ctx.Err() != nil {
			attempt.Reason = cause(ctx, errors.New(attempt.Reason)).Error()
		}
		st.Attempts = append(st.Attempts, *attempt)
		p.opts.Logger.Warn("candidate failed", "key", st.Key, "attempt", attempt.String())
		if errors.Is(attempt.Err, ErrConflict) {
			// The key was pinned meanwhile by a provision that does not
			// share this lock directory: no other candidate changes whose
			// key it is, so none is pulled.
			return p.raced(ctx, st, w, r, attempt.Err)
		}
		if ctx.Err() != nil || pl.override.Kind == images.OverrideVariant {
			break
		}
	}
	return st.allFailed(pl, pl.Held)
}

// allFailed is the status when no candidate passed: ErrAllFailed over
// every attempt's error. An earlier pin is unchanged, and named as what
// replicas may keep starting from while it still holds on this node.
func (st Status) allFailed(pl *Plan, old *containerd.Pin) Status {
	detail := attemptsSummary(st.Attempts)
	if len(pl.Candidates) > 1 {
		detail = fmt.Sprintf("all %d candidates failed: %s", len(st.Attempts), detail)
	}
	if old == nil {
		return st.fail(attemptErrors(st.Attempts, detail))
	}
	detail += "; the earlier pin " + old.Ref + " (" + old.Variant + ") is unchanged"
	st = st.fail(attemptErrors(st.Attempts, detail))
	if holds(old, pl.Node) {
		st.Pin, st.Pinned, st.Variant = old, old.Ref, old.Variant
	}
	return st
}

// raced ends a provision whose pin step found the key taken by another
// provision: ready when that pin answers this want as it is (the same
// source), else a conflict naming the holder.
func (p *Provisioner) raced(ctx context.Context, st Status, w want, r *reads, conflict error) Status {
	if pins, err := p.rt.Pins(ctx); err == nil {
		r.pins = pins
		if pl, err := p.decideReading(ctx, w, r, nil); err == nil && pl.Outcome == OutcomePinned {
			return st.ready(*pl.Pinned, true, fmt.Sprintf("pinned %s (%s) by another provision meanwhile", pl.Pinned.Ref, pl.Pinned.Variant))
		}
	}
	return st.fail(conflict)
}

// heldConflict is SetPin's refusal as provision's conflict.
func heldConflict(err error, pl *Plan, w want) error {
	var held *containerd.HeldError
	if !errors.As(err, &held) {
		return err
	}
	return &ConflictError{Key: held.Key, Held: held.Source, HeldRef: held.Ref, Claimed: w.Ref,
		NamedBy: namedWhat(pl.NamedBy), Tampered: held.Tampered, Race: true, cause: held}
}

// cause says why ctx ended, when it did: the provision timeout reads
// better than "context deadline exceeded".
func cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(err, c) && !errors.Is(c, context.Canceled) {
		return fmt.Errorf("%w: %v", err, c)
	}
	return err
}

// try pulls, probes and pins one candidate under a lease.
func (p *Provisioner) try(ctx context.Context, st *Status, pl *Plan, c images.Candidate, w want) (containerd.Pin, *probe.Verdict, *Attempt) {
	facts := pl.Node
	var (
		pin     containerd.Pin
		verdict *probe.Verdict
		attempt *Attempt
	)
	fail := func(stage string, err error, out string) {
		attempt = &Attempt{Variant: c.Variant, Ref: c.Ref, Stage: stage, Reason: err.Error(), Output: out, Err: err}
	}
	if err := p.probeProgramsFound(c, facts); err != nil {
		fail("probe", err, "")
		return pin, verdict, attempt
	}
	// The signature policy answers before anything of the image is
	// fetched: an unverified image never runs, the probe included.
	var signed *containerd.Signature
	if p.opts.Verifier != nil {
		st.Detail = "verifying the signature of " + c.Ref
		p.emit(ctx, *st)
		s, err := p.opts.Verifier.Verify(ctx, st.Engine, c.Variant, c.Ref, pl.Index)
		if err != nil {
			fail("verify", err, "")
			return pin, verdict, attempt
		}
		signed = s
	}
	err := p.rt.WithLease(ctx, func(ctx context.Context) error {
		st.State, st.Attempted, st.Detail = Pulling, c.Variant, "pulling "+c.Ref
		p.emit(ctx, *st)
		var pulled containerd.Pulled
		err := p.gatedPull(ctx, st, c.Ref, func(ctx context.Context, gate func(done, total int64), await func(context.Context, string) error) error {
			watch := p.watchPull(ctx, *st)
			defer watch.stop()
			opts := containerd.PullOptions{Platform: facts.Platform, MediaType: c.MediaType, Progress: func(pr containerd.Progress) {
				watch.progress(pr)
				gate(pr.Done, pr.Total)
				if p.opts.Progress != nil {
					p.opts.Progress(st.Key, pr)
				}
			}}
			if await != nil {
				opts.AwaitLayer = func(ctx context.Context, l ocispec.Descriptor) error { return await(ctx, l.Digest.String()) }
			}
			var err error
			pulled, err = p.rt.Pull(ctx, c.Ref, opts)
			return err
		})
		if err != nil {
			fail("pull", &PullError{Variant: c.Variant, Ref: c.Ref, Err: err}, "")
			return nil
		}
		st.State, st.Detail = Probing, "probing "+pulled.Name
		p.emit(ctx, *st)
		probing(ctx) // WithPrefetch: the next candidate is fetched meanwhile
		v, out, err := p.Probe(ctx, pulled.Name, c.Meta, st.Engine, facts)
		if err != nil {
			fail("probe", err, out)
			if pulled.Created {
				p.rt.DiscardCandidate(context.WithoutCancel(ctx), pulled.Name)
			}
			return nil
		}
		verdict = v
		st.ProbeOutput = out
		kind, _ := v.Runtime["probe"].(string) // Probe says which ran, the emulator included
		pin = containerd.Pin{
			Key: st.Key, Ref: pulled.Name, Digest: pulled.Digest, Variant: c.Variant, Source: w.Ref,
			Override: pl.Override, Node: facts.Fingerprint(), ProbedAt: time.Now(),
			Probe: kind, Verdict: compactVerdict(v), Simulated: facts.Simulated, Signed: signed,
		}
		// The pin is one update plus a demotion: once begun it is
		// finished, whatever happens to the caller meanwhile.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err = p.rt.SetPin(pctx, pin, containerd.SetPinOptions{Takeover: pl.NamedBy == NamedByWant})
		cancel()
		if err != nil {
			fail("pin", heldConflict(err, pl, w), "")
			if pulled.Created {
				p.rt.DiscardCandidate(context.WithoutCancel(ctx), pulled.Name)
			}
		}
		return nil
	})
	if err != nil && attempt == nil {
		fail("lease", err, "")
	}
	return pin, verdict, attempt
}

// probeProgramsFound checks, before c is pulled, that the host programs
// its probe mounts are there: the candidate's probe's, and on a simulated
// node the emulator's, which a fixture asks for in its config, read only
// after the pull. A gpupin from `go build` or `go install` has none.
func (p *Provisioner) probeProgramsFound(c images.Candidate, facts *node.Facts) error {
	kinds := []probe.Kind{probe.Kind(c.Probe)}
	if facts.Simulated {
		kinds = append(kinds, probe.Sim)
	}
	opts := probe.Options{CUDAProbeBinary: p.opts.CUDAProbeBinary, SimProbeBinary: p.opts.SimProbeBinary}
	for _, k := range kinds {
		if _, err := probe.Binary(k, opts); err != nil {
			return fmt.Errorf("%s probe: %w", k, err)
		}
	}
	return nil
}

// pullWatch reports a pull that stopped moving (less than the registry
// policy's StallBytes since the last look), so a status says "stalled 40s"
// rather than a bare "pulling" while the registry is silent or trickles.
// Once every byte is in, the pull is unpacking, which is not a stall.
type pullWatch struct {
	mu        sync.Mutex
	last      time.Time
	done      int64
	minBytes  int64
	unpacking bool
	stopped   chan struct{}
}

func (p *Provisioner) watchPull(ctx context.Context, st Status) *pullWatch {
	w := &pullWatch{last: time.Now(), minBytes: p.stall.StallBytes, stopped: make(chan struct{})}
	// Said after 5 s without progress, or sooner when the policy cuts a
	// stall sooner, so the status says it before the pull fails.
	after := min(5*time.Second, p.stall.StallTimeout/2)
	if after < time.Second {
		after = time.Second
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		base := st.Detail
		for {
			select {
			case <-w.stopped:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.mu.Lock()
			idle, unpacking := time.Since(w.last).Truncate(time.Second), w.unpacking
			w.mu.Unlock()
			detail := base
			switch {
			case unpacking:
				detail = base + " (unpacking)"
			case idle >= after:
				// In coarse steps: each is a change reported and logged.
				step := after
				if idle >= 30*time.Second {
					step = 30 * time.Second
				}
				detail = fmt.Sprintf("%s (stalled %s)", base, idle.Truncate(step))
			}
			if detail != st.Detail {
				st.Detail = detail
				p.emit(ctx, st)
			}
		}
	}()
	return w
}

func (w *pullWatch) progress(pr containerd.Progress) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// A byte now and then is no progress: as the registry policy judges a
	// stall, so does the status.
	if pr.Done-w.done >= w.minBytes || (pr.Done != w.done && pr.Done >= pr.Total) {
		w.done, w.last = pr.Done, time.Now()
	}
	w.unpacking = pr.Layers > 0 && pr.Total > 0 && pr.Done >= pr.Total
}

func (w *pullWatch) stop() { close(w.stopped) }

// emit tells st to the provisioner's observers (WithOnState) and to the
// one the caller's context carries (withObserver).
func (p *Provisioner) emit(ctx context.Context, st Status) {
	for _, fn := range p.opts.OnState {
		fn(st)
	}
	if fn, ok := ctx.Value(observerKey{}).(func(Status)); ok {
		fn(st)
	}
}

type observerKey struct{}

// withObserver makes ctx carry fn, which sees the states of the provisions
// run under ctx: a Loop sees its own runs without adding itself to the
// Provisioner's observers, which every other user of it would then feed.
func withObserver(ctx context.Context, fn func(Status)) context.Context {
	return context.WithValue(ctx, observerKey{}, fn)
}

// compactVerdict is the verdict as the pin's label keeps it: small.
func compactVerdict(v *probe.Verdict) string {
	type dev struct {
		Index  int     `json:"i"`
		CC     string  `json:"cc"`
		TFLOPS float64 `json:"tflops"`
	}
	c := struct {
		OK        bool     `json:"ok"`
		Devices   []dev    `json:"devices"`
		Simulated bool     `json:"simulated,omitempty"`
		Checks    []string `json:"simulated_checks,omitempty"`
	}{OK: v.OK, Simulated: v.Simulated}
	for _, d := range v.Devices {
		c.Devices = append(c.Devices, dev{d.Index, d.CC, d.TFLOPS})
	}
	// Bounded, so the label stays whole JSON: an exec self-test may list
	// any number of checks.
	for i, s := range v.SimulatedChecks {
		if i == 8 {
			c.Checks = append(c.Checks, fmt.Sprintf("… and %d more", len(v.SimulatedChecks)-8))
			break
		}
		if len(s) > 120 {
			s = s[:117] + "..."
		}
		c.Checks = append(c.Checks, s)
	}
	b, _ := json.Marshal(c)
	return string(b)
}
