package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpupin/gpupin/containerd"
)

// LoopOptions tune a Loop.
type LoopOptions struct {
	// Recheck is how often a ready (or disabled, or unsupported) engine is
	// checked again; default 10m. A check of a pin proved on this node is a
	// look at containerd, without the registry.
	Recheck time.Duration
	// RetryMin is the first wait after a failure; it doubles with each
	// failure in a row, up to Recheck; default 1m.
	RetryMin time.Duration
	// NodeCheck is how often the node's facts are read between passes, so
	// a driver upgrade or a GPU swap is noticed; default 1m.
	NodeCheck time.Duration
	// Parallel is how many engines are provisioned at once; default 2.
	Parallel int
	// OnChange sees an engine's status each time its state, detail or
	// pinned reference changes, intermediate states (pulling, probing)
	// included; never twice for the same.
	OnChange func(Status)
	// OnResult sees every finished provision of every pass (metrics).
	OnResult func(Status)
	Logger   *slog.Logger
	// NoSweep skips the sweep of leftovers when Run starts.
	NoSweep bool
}

// Loop keeps a node converged on a set of wanted engines: a change of the
// wants or overrides is acted on at once, ready engines are re-checked on
// a timer, failures are retried with backoff, and a change of the node's
// fingerprint re-proves every engine.
type Loop struct {
	p    *Provisioner
	opts LoopOptions
	kick chan struct{}
	// gens numbers every change across the loop: an entry removed and
	// added again must not reuse the numbers of its cancelled runs.
	gens uint64

	cbMu sync.Mutex // keeps callbacks in the order of the changes
	mu   sync.Mutex
	// entries by want key, in the order of the last SetWants.
	entries  map[string]*entry
	order    []string
	fp       string
	inFlight int
}

type entry struct {
	want     want
	gen      uint64 // bumped on every change of the want or its override
	engine   string // the engine's name as the provision's plan named it
	due      time.Time
	failures int
	running  *loopRun
	status   Status
	reported *Status
}

type loopRun struct {
	gen    uint64
	cancel context.CancelFunc
}

type loopResult struct {
	key string
	gen uint64
	st  Status
	err error // the run's context ended: the result answers nothing
}

// A Loop's defaults (LoopOptions' zero values).
const (
	DefaultRecheck   = 10 * time.Minute // a ready engine checked again
	DefaultRetryMin  = time.Minute      // first retry after a failure, doubling up to the recheck
	DefaultNodeCheck = time.Minute      // the driver and GPUs read again
	DefaultParallel  = 2                // engines provisioned at once: pulls share the link and the disk
)

// NewLoop makes a Loop over p. p is not changed: the Loop sees the
// intermediate states of its own runs only, through their context, so
// loops and other callers can share one Provisioner.
func NewLoop(p *Provisioner, opts LoopOptions) *Loop {
	if opts.Recheck <= 0 {
		opts.Recheck = DefaultRecheck
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = DefaultRetryMin
	}
	if opts.RetryMin > opts.Recheck {
		opts.RetryMin = opts.Recheck
	}
	if opts.NodeCheck <= 0 {
		opts.NodeCheck = DefaultNodeCheck
	}
	if opts.Parallel <= 0 {
		opts.Parallel = DefaultParallel
	}
	if opts.Logger == nil {
		opts.Logger = p.opts.Logger
	}
	l := &Loop{p: p, opts: opts, kick: make(chan struct{}, 1), entries: map[string]*entry{}}
	return l
}

// SetWants replaces the wanted engines. New and changed wants are
// provisioned at once; an engine no longer wanted is no longer reported
// (its pin is kept until gc). Every want is checked first: on an error
// nothing changes.
func (l *Loop) SetWants(wants []Want) error {
	seen := map[string]bool{}
	read := make([]want, len(wants))
	for i, w := range wants {
		var err error
		if read[i], err = readWant(w); err != nil {
			return fmt.Errorf("want %d: %w", i+1, err)
		}
		if seen[w.Key()] {
			return fmt.Errorf("want %d: %s is wanted twice", i+1, w.Key())
		}
		seen[w.Key()] = true
	}
	l.mu.Lock()
	order := make([]string, 0, len(wants))
	for _, w := range read {
		k := w.Key()
		order = append(order, k)
		e, ok := l.entries[k]
		if !ok {
			l.gens++
			e = &entry{want: w, gen: l.gens}
			l.entries[k] = e
			e.status = l.pending(e)
			continue
		}
		if e.want.Want != w.Want {
			e.want = w
			l.changed(e)
		}
	}
	for k, e := range l.entries {
		if !seen[k] {
			if e.running != nil {
				e.running.cancel()
			}
			delete(l.entries, k)
			l.opts.Logger.Info("engine no longer wanted; its pin is kept until gc", "key", e.status.Key)
		}
	}
	l.order = order
	news := l.pendingReports()
	l.mu.Unlock()
	l.report(news)
	l.wake()
	return nil
}

// SetOverrides replaces the per-engine overrides that apply to wants
// naming none of their own, in the provisioner's override source
// (OverrideSource.Replace: an *Overrides sets them,
// provision.WithOverrides(provision.NewOverrides()); a file refuses).
// An engine whose override changes is provisioned again at once. On an
// error nothing changes.
func (l *Loop) SetOverrides(m map[string]string) error {
	if err := l.p.opts.Overrides.Replace(m); err != nil {
		return err
	}
	l.mu.Lock()
	for _, e := range l.entries {
		if l.overrideChanged(e) {
			l.changed(e)
		}
	}
	l.mu.Unlock()
	l.wake()
	return nil
}

// overrideChanged reports whether the override that applies to an entry's
// engine now is not the one its last provision ran under. The engine's
// name is the one that provision's plan gave.
func (l *Loop) overrideChanged(e *entry) bool {
	if e.want.Override != "" || e.engine == "" {
		return false // its own override; or not yet planned, and due anyway
	}
	o, ok, err := l.p.opts.Overrides.Override(e.engine)
	now := "auto"
	if err == nil && ok {
		now = o.String()
	}
	return now != e.status.Override
}

// Unnamed lists the wants (by key) whose engine has no name yet: the want
// names none, and no plan of it has read its image (a registry that has
// been down since it was wanted). An override set meanwhile under the name
// its image will give it applies from its first plan that reads the image:
// every plan reads the overrides afresh, and a run that learns the name
// under an override it did not run with runs again at once (finish).
func (l *Loop) Unnamed() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, k := range l.order {
		if l.engineOf(l.entries[k]) == "" {
			out = append(out, k)
		}
	}
	return out
}

// Overrides returns the overrides the loop's provisioner holds
// (OverrideSource.Map: none for a source held elsewhere).
func (l *Loop) Overrides() map[string]string {
	return l.p.opts.Overrides.Map()
}

// Wants returns the wanted engines, in order.
func (l *Loop) Wants() []Want {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Want, 0, len(l.order))
	for _, k := range l.order {
		out = append(out, l.entries[k].want.Want)
	}
	return out
}

// Engines lists the engine names of the wants: as the want names it, else
// as the image's metadata did, else as guessed from the repository.
func (l *Loop) Engines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := map[string]bool{}
	for _, e := range l.entries {
		if n := l.engineOf(e); n != "" {
			set[n] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// Status returns the latest status of every wanted engine, in the order
// of the wants.
func (l *Loop) Status() []Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Status, 0, len(l.order))
	for _, k := range l.order {
		out = append(out, l.entries[k].status)
	}
	return out
}

// InFlight is how many provisions are running now.
func (l *Loop) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight
}

// Kick asks for a pass now: due engines run and the node is read again.
func (l *Loop) Kick() { l.wake() }

// Recheck makes the engines whose status or want has this key due now,
// as if their wants had changed: a caller that saw an engine's pin go
// (`gpupin unpin` beside the agent) has it provisioned again at once
// rather than at its next Recheck; a run under way is left to finish.
// It reports whether any matched.
func (l *Loop) Recheck(key string) bool {
	l.mu.Lock()
	found := false
	for _, e := range l.entries {
		if e.status.Key != key && e.want.Key() != key {
			continue
		}
		found = true
		// A run under way answers afresh anyway: not cut short.
		if e.running == nil {
			l.changed(e)
		}
	}
	l.mu.Unlock()
	if found {
		l.wake()
	}
	return found
}

func (l *Loop) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run converges until ctx ends. It sweeps what an interrupted run left
// first. On return every provision it started has finished, cleanup
// included: a pin is made by one containerd update, so it is made or not.
func (l *Loop) Run(ctx context.Context) error {
	if !l.opts.NoSweep {
		l.sweep(ctx)
	}
	results := make(chan loopResult)
	for {
		now := time.Now()
		l.checkNode(ctx)
		l.launch(ctx, now, results)
		timer := time.NewTimer(max(l.nextWake(now).Sub(now), 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			l.drain(results)
			return nil
		case r := <-results:
			l.finish(r)
		case <-l.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// Sweeper removes what an interrupted gpupin left: probe containers,
// leases, candidate records.
type Sweeper interface {
	Sweep(ctx context.Context) (containerd.Swept, error)
}

// sweep removes what an interrupted gpupin left (probe containers,
// leases, candidate records), where the runtime can.
func (l *Loop) sweep(ctx context.Context) {
	s, err := l.p.rt.Sweep(ctx)
	if errors.Is(err, errNoRuntime) {
		return // a provisioner without containerd has nothing to sweep
	}
	if err != nil {
		l.opts.Logger.Warn("sweep of leftovers failed", "err", err)
		return
	}
	l.opts.Logger.Info("swept leftovers of interrupted runs", "containers", s.Containers, "leases", s.Leases, "candidates", s.Candidates)
}

// drain cancels every run and waits for each to finish its cleanup.
func (l *Loop) drain(results chan loopResult) {
	l.mu.Lock()
	for _, e := range l.entries {
		if e.running != nil {
			e.running.cancel()
		}
	}
	n := l.inFlight
	l.mu.Unlock()
	for ; n > 0; n-- {
		l.finish(<-results)
	}
}

// checkNode reads the node's facts; a new fingerprint makes every engine
// due, and Provision re-proves a pin made under another fingerprint.
func (l *Loop) checkNode(ctx context.Context) {
	facts, err := l.p.opts.Node.Read(ctx)
	if err != nil {
		l.opts.Logger.Warn("read node facts", "err", err)
		return
	}
	fp := "unsupported: " + facts.Unsupported
	if facts.Supported() {
		fp = facts.Fingerprint()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if fp == l.fp {
		return
	}
	if l.fp != "" {
		l.opts.Logger.Info("node changed (driver or GPUs): re-proving every engine", "from", l.fp, "to", fp)
		for _, e := range l.entries {
			l.changed(e)
		}
	}
	l.fp = fp
}

// changed makes an entry due now: a run in progress for the old want is
// cancelled and its result dropped; the backoff starts over.
func (l *Loop) changed(e *entry) {
	l.gens++
	e.gen = l.gens
	e.due = time.Time{}
	e.failures = 0
	if e.running != nil {
		e.running.cancel()
	}
}

// launch starts the due entries, changed ones first, up to Parallel.
func (l *Loop) launch(ctx context.Context, now time.Time, results chan<- loopResult) {
	l.mu.Lock()
	var news []Status
	defer func() { l.mu.Unlock(); l.report(news) }()
	var due []*entry
	keys := map[*entry]string{}
	for _, k := range l.order {
		e := l.entries[k]
		if e.running == nil && !e.due.After(now) {
			due = append(due, e)
			keys[e] = k
		}
	}
	sort.SliceStable(due, func(i, j int) bool { return due[i].due.Before(due[j].due) })
	for i, e := range due {
		if l.inFlight >= l.opts.Parallel {
			// Say what the rest wait for: a slot, not a registry.
			var running []string
			for _, k := range l.order {
				if r := l.entries[k]; r.running != nil {
					running = append(running, r.status.Key)
				}
			}
			for _, w := range due[i:] {
				if w.status.State == Pending {
					w.status.Detail = fmt.Sprintf("waiting for one of %d provision slots, taken by %s", l.opts.Parallel, strings.Join(running, ", "))
				}
			}
			news = l.pendingReports()
			return
		}
		rctx, cancel := context.WithCancel(ctx)
		e.running = &loopRun{gen: e.gen, cancel: cancel}
		if e.status.State == Pending {
			// It holds a slot now: not waiting for one, nor for its pass,
			// until the provision says what it does (it says resolving
			// only where a registry is asked).
			e.status.Detail, e.status.At = "started: reading the node and the pins", now
		}
		w := e.want
		key, gen := keys[e], e.gen
		l.inFlight++
		go func() {
			defer cancel()
			st := l.p.provisionWant(withObserver(rctx, l.observe), w)
			results <- loopResult{key: key, gen: gen, st: st, err: rctx.Err()}
		}()
	}
}

// finish records a run's result and schedules the entry's next pass.
func (l *Loop) finish(r loopResult) {
	l.mu.Lock()
	l.inFlight--
	e, ok := l.entries[r.key]
	if !ok || e.running == nil || e.running.gen != r.gen {
		l.mu.Unlock()
		return // the want went away while it ran
	}
	e.running = nil
	if r.gen != e.gen || r.err != nil {
		// Changed or cancelled while it ran: the result answers an old
		// question. A changed entry is already due.
		if r.gen != e.gen {
			e.due = time.Time{}
		}
		news := l.restore(e)
		l.mu.Unlock()
		l.report(news)
		return
	}
	now := time.Now()
	if r.st.Engine != "" {
		e.engine = r.st.Engine
	}
	e.status = r.st
	if r.st.State == Failed {
		e.failures++
		e.due = now.Add(l.backoff(e.failures))
	} else {
		e.failures = 0
		e.due = now.Add(l.opts.Recheck)
	}
	// The overrides changed while it ran, under the name its plan gave the
	// engine: once more, now.
	if l.overrideChanged(e) {
		l.gens++
		e.gen = l.gens
		e.due = time.Time{}
	}
	news := l.pendingReports()
	l.mu.Unlock()
	if l.opts.OnResult != nil {
		l.opts.OnResult(r.st)
	}
	l.report(news)
}

// restore puts back the last settled status after a dropped run, so an
// intermediate state of a cancelled run is not left on show.
func (l *Loop) restore(e *entry) []Status {
	if underWay(e.status.State) {
		if e.reported != nil && !underWay(e.reported.State) {
			e.status = *e.reported
		} else {
			e.status = l.pending(e)
		}
	}
	return l.pendingReports()
}

func (l *Loop) backoff(failures int) time.Duration {
	d := l.opts.RetryMin
	for i := 1; i < failures && d < l.opts.Recheck; i++ {
		d *= 2
	}
	return min(d, l.opts.Recheck)
}

// nextWake is the earliest due time of an idle entry, or the next read of
// the node's facts.
func (l *Loop) nextWake(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := now.Add(l.opts.NodeCheck)
	for _, e := range l.entries {
		if e.running == nil && e.due.Before(next) && l.inFlight < l.opts.Parallel {
			next = e.due
		}
	}
	return next
}

// observe takes the intermediate states of the loop's own runs.
func (l *Loop) observe(st Status) {
	l.mu.Lock()
	var match *entry
	for _, e := range l.entries {
		if e.want.Ref == st.Ref && e.running != nil && e.running.gen == e.gen {
			if match != nil {
				l.mu.Unlock()
				return // two wants of one reference: cannot tell which
			}
			match = e
		}
	}
	if match == nil || !underWay(st.State) {
		// Final states come with the run's result, which knows its generation.
		l.mu.Unlock()
		return
	}
	match.status = st
	news := l.pendingReports()
	l.mu.Unlock()
	l.report(news)
}

// pendingReports collects statuses that changed since they were last
// reported, and marks them reported. Called with mu held.
func (l *Loop) pendingReports() []Status {
	var out []Status
	for _, k := range l.order {
		e := l.entries[k]
		if e == nil {
			continue
		}
		if r := e.reported; r != nil && r.State == e.status.State && r.Detail == e.status.Detail && r.Pinned == e.status.Pinned {
			continue
		}
		if e.failures > 0 && underWay(e.status.State) {
			// A retry after a failure goes quietly: only its outcome is
			// reported, and only if it differs from the failure before.
			continue
		}
		st := e.status
		e.reported = &st
		out = append(out, st)
	}
	return out
}

// report logs each change once and hands it to OnChange.
func (l *Loop) report(sts []Status) {
	if len(sts) == 0 {
		return
	}
	l.cbMu.Lock()
	defer l.cbMu.Unlock()
	for _, st := range sts {
		level := slog.LevelInfo
		if st.State == Failed {
			level = slog.LevelWarn
		}
		l.opts.Logger.Log(context.Background(), level, "engine "+string(st.State), "key", st.Key, "variant", st.Variant, "attempted", st.Attempted,
			"pinned", st.Pinned, "override", st.Override, "simulated", st.Simulated, "detail", st.Detail)
		if l.opts.OnChange != nil {
			l.opts.OnChange(st)
		}
	}
}

func (l *Loop) pending(e *entry) Status {
	st := pending(e.want.Want)
	st.Engine, st.Detail, st.At = l.engineOf(e), "waiting for its first pass", time.Now()
	return st
}

// engineOf is the engine's name as the want gives it, else as the last
// provision's plan named it; "" before the first.
func (l *Loop) engineOf(e *entry) string {
	if e.want.Engine != "" {
		return e.want.Engine
	}
	return e.engine
}

// underWay reports the states of a provision still running.
func underWay(s State) bool { return s == Resolving || s == Pulling || s == Probing }
