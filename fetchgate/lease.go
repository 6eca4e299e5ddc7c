package fetchgate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpupin/gpupin/internal/kubelease"
)

// The leases' names and marks. A digest's leases share a label (its hex,
// clipped to a label value's 63 characters), so one watch sees every slot.
const (
	namePrefix    = "gpupin-fetch-"
	LabelDigest   = "gpupin.io/fetch"
	labelManaged  = "app.kubernetes.io/managed-by"
	AnnotRef      = "gpupin.io/ref"
	AnnotState    = "gpupin.io/state"
	AnnotProgress = "gpupin.io/progress"
	// AnnotLayers lists the layer blobs the holder has committed so far,
	// comma-separated digests, as they land: a waiter's pull fetches each
	// through its mirror once it is listed. A lease without it (a holder
	// from before layer-by-layer release) is waited on whole.
	AnnotLayers = "gpupin.io/layers"

	StateFetching = "fetching"
	StateFetched  = "fetched"
	StateReleased = "released" // the fetch failed: the next node takes over at once
	// StateUnserved: the holder has every byte but its mirror does not
	// answer, so no peer can get them from it: the next node takes over.
	StateUnserved = "unserved"
)

// maxSkew is how far another node's clock may run from ours before a
// renewal time it wrote is trusted to say its lease ran out; below that a
// lease runs out only when we have seen it unrenewed for its duration.
const maxSkew = time.Minute

// LeaseName is the name of slot's lease for digest dg.
func LeaseName(dg string, slot int) string {
	return namePrefix + strings.TrimPrefix(dg, "sha256:") + "-" + strconv.Itoa(slot)
}

func digestLabel(dg string) string {
	h := strings.TrimPrefix(dg, "sha256:")
	return h[:min(len(h), 63)]
}

// turn is how a wait ended: this node holds a lease, another node fetched
// the digest, or the node fetches from upstream after all (the reason).
type turn struct {
	held      *coordv1.Lease
	follow    *coordv1.Lease // a live holder's that lists its layers
	fetchedBy string
	fallback  string
}

// observed is what this node saw of a lease and when it last changed:
// expiry is judged on our clock, as client-go's leader election does.
type observed struct {
	mark string
	at   time.Time
}

// verdict is what the leases of a digest say now.
type verdict struct {
	fetchedBy string   // a slot says fetched, by this node
	free      []int    // slots that can be taken
	holders   []string // who fetches meanwhile
	follow    *coordv1.Lease
	recheck   time.Time // when a held lease would run out, unrenewed
	// seenFree: a slot is free in a lease seen (not merely unlisted).
	seenFree bool
}

// judge reads the slots' leases (nil: none) as seen at now, updating
// seen. It asks nothing of the API.
func (g *Gate) judge(slots []*coordv1.Lease, seen map[string]observed, now time.Time) verdict {
	var v verdict
	for i, l := range slots {
		if l == nil {
			v.free = append(v.free, i)
			continue
		}
		if l.Annotations[AnnotState] == StateFetched {
			v.fetchedBy = kubelease.Holder(l)
			if v.fetchedBy == "" {
				v.fetchedBy = "another node"
			}
			return v
		}
		holder := kubelease.Holder(l)
		if st := l.Annotations[AnnotState]; holder == "" || holder == g.identity || st == StateReleased || st == StateUnserved {
			// Released, unserved, or ours from before a restart: that
			// pull is gone, or brings the others nothing.
			v.free = append(v.free, i)
			continue
		}
		d := g.cfg.leaseDuration
		if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		mark := holder + "|" + renewTime(l).UTC().Format(time.RFC3339Nano)
		o, ok := seen[l.Name]
		if !ok || o.mark != mark {
			o = observed{mark: mark, at: now}
			seen[l.Name] = o
		}
		stale := !renewTime(l).IsZero() && now.Sub(renewTime(l)) > d+maxSkew
		if now.Sub(o.at) >= d || stale {
			v.free = append(v.free, i)
			continue
		}
		v.holders = append(v.holders, holder)
		if _, lists := l.Annotations[AnnotLayers]; lists && v.follow == nil {
			v.follow = l
		}
		if until := o.at.Add(d); v.recheck.IsZero() || until.Before(v.recheck) {
			v.recheck = until
		}
	}
	return v
}

// renewTime is when the lease was last renewed, else acquired.
func renewTime(l *coordv1.Lease) time.Time {
	if t := kubelease.Renewed(l); !t.IsZero() {
		return t
	}
	return kubelease.Acquired(l)
}

// slotsOf places the listed leases of dg in their slots.
func (g *Gate) slotsOf(dg string, items []coordv1.Lease) []*coordv1.Lease {
	slots := make([]*coordv1.Lease, g.cfg.concurrency)
	for i := range items {
		for s := range slots {
			if items[i].Name == LeaseName(dg, s) {
				slots[s] = &items[i]
			}
		}
	}
	return slots
}

// wait returns this node's turn to pull dg. Its error is ctx's alone.
func (g *Gate) wait(ctx context.Context, dg, ref string, note func(string)) (turn, error) {
	deadline := time.Now().Add(g.cfg.maxWait)
	var failingSince time.Time // the first API error of an unbroken run
	seen := map[string]observed{}
	sel := LabelDigest + "=" + digestLabel(dg)
	backoff := 200 * time.Millisecond
	lastNote := ""
	// apiDown says whether API errors have lasted past the bound; until
	// then the wait goes on with backoff.
	apiDown := func(err error) (turn, bool) {
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		if time.Since(failingSince) < g.cfg.outageBound {
			return turn{}, false
		}
		return turn{fallback: fmt.Sprintf("the API server did not answer for %s while waiting for another node's fetch (%v)",
			time.Since(failingSince).Truncate(time.Second), err)}, true
	}
	for {
		if err := ctx.Err(); err != nil {
			return turn{}, err
		}
		if !time.Now().Before(deadline) {
			return turn{fallback: fmt.Sprintf("waited %s, the bound (max wait), for another node's fetch", g.cfg.maxWait)}, nil
		}
		list, err := g.leases.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			if t, down := apiDown(err); down {
				return t, nil
			}
			if err := kubelease.Sleep(ctx, backoff); err != nil {
				return turn{}, err
			}
			backoff = min(backoff*2, g.cfg.renewEvery)
			continue
		}
		failingSince, backoff = time.Time{}, 200*time.Millisecond
		slots := g.slotsOf(dg, list.Items)
		v := g.judge(slots, seen, time.Now())
		if v.fetchedBy != "" {
			return turn{fetchedBy: v.fetchedBy}, nil
		}
		for _, s := range v.free {
			l, err := g.take(ctx, dg, ref, s, slots[s])
			if err == nil {
				return turn{held: l}, nil
			}
			if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
				g.cfg.logger.Debug("lease not taken", "lease", LeaseName(dg, s), "err", err)
			}
		}
		if len(v.free) > 0 {
			continue // another node took it first: read again
		}
		if v.follow != nil {
			return turn{follow: v.follow}, nil
		}
		if line := "waiting for " + strings.Join(v.holders, ", ") + " to fetch " + short(dg) + " from upstream (at most until " +
			deadline.Format(time.TimeOnly) + ")"; line != lastNote {
			note(line)
			lastNote = line
		}
		until := v.recheck
		if until.After(deadline) || until.IsZero() {
			until = deadline
		}
		err = g.watchUntil(ctx, dg, sel, list.ResourceVersion, seen, until, func(_ *coordv1.Lease, v verdict) bool {
			return v.fetchedBy != "" || v.seenFree || v.follow != nil
		})
		if err != nil {
			return turn{}, err
		}
	}
}

// watchUntil follows the digest's leases from rv, telling stop of each
// lease that changes and what the leases say then, until stop says so, a
// lease is deleted, until passes, or the watch ends; the caller then
// reads them again. Its error is ctx's alone.
func (g *Gate) watchUntil(ctx context.Context, dg, sel, rv string, seen map[string]observed, until time.Time, stop func(*coordv1.Lease, verdict) bool) error {
	wctx, cancel := context.WithDeadline(ctx, until.Add(50*time.Millisecond))
	defer cancel()
	timeout := int64(max(1, time.Until(until).Seconds()+1))
	w, err := g.leases.Watch(wctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: rv, TimeoutSeconds: &timeout})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Read again after a pause; the caller judges the outage.
		return kubelease.Sleep(ctx, min(time.Second, time.Until(until)))
	}
	defer w.Stop()
	slots := make([]*coordv1.Lease, g.cfg.concurrency)
	for {
		select {
		case <-wctx.Done():
			return ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return ctx.Err()
			}
			l, isLease := ev.Object.(*coordv1.Lease)
			if !isLease {
				continue
			}
			for s := range slots {
				if l.Name != LeaseName(dg, s) {
					continue
				}
				slots[s] = l
				if ev.Type == watch.Deleted {
					return nil // a slot freed: read again
				}
			}
			v := g.judge(slots, seen, time.Now())
			for _, s := range v.free {
				v.seenFree = v.seenFree || slots[s] != nil
			}
			if stop(l, v) {
				return nil
			}
		}
	}
}

// take makes this node the holder of slot's lease, creating it, or
// replacing a holder that released it or ran out.
func (g *Gate) take(ctx context.Context, dg, ref string, slot int, old *coordv1.Lease) (*coordv1.Lease, error) {
	now := metav1.NewMicroTime(time.Now())
	secs := int32(g.cfg.leaseDuration / time.Second)
	id := g.identity
	if old == nil {
		l := &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:        LeaseName(dg, slot),
				Labels:      map[string]string{LabelDigest: digestLabel(dg), labelManaged: "gpupin"},
				Annotations: map[string]string{AnnotRef: ref, AnnotState: StateFetching, AnnotLayers: ""},
			},
			Spec: coordv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		return g.leases.Create(ctx, l, metav1.CreateOptions{})
	}
	l := old.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotRef], l.Annotations[AnnotState], l.Annotations[AnnotLayers] = ref, StateFetching, ""
	delete(l.Annotations, AnnotProgress)
	transitions := int32(0)
	if l.Spec.LeaseTransitions != nil {
		transitions = *l.Spec.LeaseTransitions
	}
	transitions++
	l.Spec = coordv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now,
		LeaseTransitions: &transitions}
	// Update carries old's resourceVersion: of two nodes that saw the
	// same lease run out, one gets a conflict.
	return g.leases.Update(ctx, l, metav1.UpdateOptions{})
}

// hold runs pull as the lease's holder: renewed while bytes move, its
// committed layers listed as they land (the waiters' pulls follow a layer
// behind), marked fetched as soon as every layer is in (their pulls then
// overlap this node's unpack and probe), released when the pull failed.
func (g *Gate) hold(ctx context.Context, ref string, l *coordv1.Lease, pull Pull) error {
	p := newPulling()
	h := g.startHolding(ctx, ref, l, p)
	err := pull(ctx, p.progress, nil)
	h.end(ctx, err)
	return err
}

// pulling is what a pull under the gate has reported.
type pulling struct {
	done, total atomic.Int64
	allIn       chan struct{} // closed once every byte is in
	once        sync.Once
}

func newPulling() *pulling { return &pulling{allIn: make(chan struct{})} }

func (p *pulling) progress(d, t int64) {
	p.done.Store(d)
	p.total.Store(t)
	if t > 0 && d >= t {
		p.once.Do(func() { close(p.allIn) })
	}
}

// startHolding keeps l for the pull p reports on, until end.
func (g *Gate) startHolding(ctx context.Context, ref string, l *coordv1.Lease, p *pulling) *holding {
	h := &holding{g: g, ref: ref, lease: l, p: p, stop: make(chan struct{}), renewed: make(chan struct{})}
	go func() {
		defer close(h.renewed)
		h.renewWhileMoving(ctx)
	}()
	return h
}

// end stops renewing and writes how the pull ended (err).
func (h *holding) end(ctx context.Context, err error) {
	close(h.stop)
	<-h.renewed
	// Told whatever became of the caller: others wait on it.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	switch {
	case err != nil:
		// Even after an early mark: a node that comes later fetches
		// again rather than trust a pull that failed.
		h.finish(fctx, StateReleased, h.p.done.Load(), h.p.total.Load())
	case !h.marked && !h.lost:
		// A lost lease is another's now: its mirror is not asked.
		h.finish(fctx, h.served(fctx), h.p.done.Load(), h.p.total.Load())
	}
}

type holding struct {
	g       *Gate
	ref     string
	p       *pulling
	stop    chan struct{}  // closed when the pull ended
	renewed chan struct{}  // closed when renewWhileMoving returned
	lease   *coordv1.Lease // as last written
	lost    bool
	marked  bool // fetched or unserved already written
	listed  int  // layers listed in the lease
}

// served is the state every byte in earns: fetched, or unserved where no
// mirror of this node answers (it died during the pull), so that a waiter
// fetches instead of every waiter missing its mirror and going upstream.
func (h *holding) served(ctx context.Context) string {
	if reason := h.g.noMirror(ctx, h.ref); reason != "" {
		h.g.cfg.logger.Warn("every byte in, but no peer can get it from this node; another node fetches", "ref", h.ref, "reason", reason)
		return StateUnserved
	}
	return StateFetched
}

// renewWhileMoving renews the lease every renewEvery in which the pull
// moved at least minProgress bytes, or, with every byte in, while it
// unpacks within the grace. A pull that moves nothing lets it run out.
// Every listEvery it lists the layers newly committed (committed, not
// counted: progress counts a blob's bytes before its commit, and Spegel
// advertises it only on the commit's event). Once every layer is stored
// it marks the lease (served) and renews no more: the waiters have what
// they wait for.
func (h *holding) renewWhileMoving(ctx context.Context) {
	t := time.NewTicker(h.g.cfg.renewEvery)
	defer t.Stop()
	var list <-chan time.Time
	if h.g.cfg.stored != nil {
		l := time.NewTicker(listEvery)
		defer l.Stop()
		list = l.C
	}
	allIn := h.p.allIn
	var last int64
	var allInAt time.Time
	for {
		select {
		case <-h.stop:
			return
		case <-ctx.Done():
			return
		case <-allIn:
			allIn = nil
			if h.g.cfg.stored == nil {
				// Nothing to check the bytes against: they count as in.
				h.finish(ctx, h.served(ctx), h.p.done.Load(), h.p.total.Load())
				if h.marked || h.lost {
					return
				}
			} else if h.list(ctx) {
				return
			}
			continue
		case <-list:
			if h.list(ctx) {
				return
			}
			continue
		case <-t.C:
		}
		if h.lost {
			return
		}
		d, tot := h.p.done.Load(), h.p.total.Load()
		moved := d-last >= h.g.cfg.minProgress
		if tot > 0 && d >= tot {
			if allInAt.IsZero() {
				allInAt = time.Now()
				moved = true
			} else {
				moved = time.Since(allInAt) < h.g.cfg.unpackGrace
			}
		}
		if !moved {
			continue
		}
		if err := h.write(ctx, func(l *coordv1.Lease) {
			now := metav1.NewMicroTime(time.Now())
			l.Spec.RenewTime = &now
			l.Annotations[AnnotProgress] = fmt.Sprintf("%d/%d", d, tot)
		}); err != nil {
			h.g.cfg.logger.Debug("lease not renewed", "lease", h.lease.Name, "err", err)
			continue
		}
		last = d
	}
}

// listEvery is how often a holder looks for layers newly committed.
const listEvery = 200 * time.Millisecond

// list writes the layers committed since the last listing into the lease,
// or, once every layer is, marks it. It says whether the lease is marked
// (or lost) now: nothing more is written then.
func (h *holding) list(ctx context.Context) bool {
	if h.lost {
		return true
	}
	layers, all := h.g.cfg.stored(ctx, h.ref)
	if all {
		select {
		case <-h.p.allIn:
			h.finish(ctx, h.served(ctx), h.p.done.Load(), h.p.total.Load())
			return h.marked || h.lost
		default:
			// Stored, yet the pull has not said every byte is in: its
			// progress is behind; the mark waits for it.
		}
	}
	if len(layers) <= h.listed {
		return false
	}
	if h.served(ctx) == StateUnserved {
		// Listed, they would send the waiters to a mirror that cannot
		// serve them: one takes the lease over instead.
		h.finish(ctx, StateUnserved, h.p.done.Load(), h.p.total.Load())
		return h.marked || h.lost
	}
	err := h.write(ctx, func(l *coordv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now // a layer landed: progress
		l.Annotations[AnnotLayers] = strings.Join(layers, ",")
		l.Annotations[AnnotProgress] = fmt.Sprintf("%d/%d", h.p.done.Load(), h.p.total.Load())
	})
	if err != nil {
		h.g.cfg.logger.Debug("layers not listed", "lease", h.lease.Name, "err", err)
		return h.lost
	}
	h.listed = len(layers)
	return false
}

// finish marks the lease fetched, unserved or released.
func (h *holding) finish(ctx context.Context, state string, done, total int64) {
	if h.lost {
		return
	}
	err := h.write(ctx, func(l *coordv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		l.Annotations[AnnotState] = state
		l.Annotations[AnnotProgress] = fmt.Sprintf("%d/%d", done, total)
		if state == StateReleased {
			l.Spec.HolderIdentity = nil
		}
	})
	if err == nil && state != StateReleased {
		h.marked = true
	}
	if err != nil && !h.lost {
		// The others find it run out within its duration.
		h.g.cfg.logger.Warn("fetch lease not marked; other nodes wait until it runs out", "lease", h.lease.Name, "state", state, "err", err)
	}
}

// write changes the lease as last written; a conflict reads it again and
// goes on only while this node still holds it.
func (h *holding) write(ctx context.Context, change func(*coordv1.Lease)) error {
	for range 3 {
		l := h.lease.DeepCopy()
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		change(l)
		out, err := h.g.leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			h.lease = out
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("lease %s: %w", h.lease.Name, err)
		}
		cur, gerr := h.g.leases.Get(ctx, h.lease.Name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("lease %s: %w", h.lease.Name, gerr)
		}
		if kubelease.Holder(cur) != h.g.identity || cur.Annotations[AnnotState] != StateFetching {
			h.lost = true
			h.g.cfg.logger.Warn("fetch lease lost to another node; the pull goes on", "lease", cur.Name, "holder", kubelease.Holder(cur))
			return fmt.Errorf("lease %s: held by %q now", cur.Name, kubelease.Holder(cur))
		}
		h.lease = cur
	}
	return fmt.Errorf("lease %s: conflicts kept coming", h.lease.Name)
}

// sweep deletes this namespace's fetch leases that ended (fetched,
// released, or run out) longer than retain ago; at most every ten
// minutes per gate, and never one that changed since it was read.
func (g *Gate) sweep(ctx context.Context) {
	g.mu.Lock()
	if time.Since(g.lastSwep) < 10*time.Minute {
		g.mu.Unlock()
		return
	}
	g.lastSwep = time.Now()
	g.mu.Unlock()
	list, err := g.leases.List(ctx, metav1.ListOptions{LabelSelector: LabelDigest})
	if err != nil {
		return
	}
	for _, l := range list.Items {
		if time.Since(renewTime(&l)) < g.cfg.retain+maxSkew {
			continue
		}
		rv := l.ResourceVersion
		if err := g.leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}); err == nil {
			g.cfg.logger.Debug("old fetch lease deleted", "lease", l.Name)
		}
	}
}
