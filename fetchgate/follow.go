package fetchgate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupin/gpupin/internal/kubelease"
)

// follow runs pull while another node holds the digest's lease: the pull
// starts at once and fetches each layer (through the node's mirror) once
// the holder lists it, so it runs a layer behind the holder's instead of
// after it. Where the holder goes (dies, stalls, releases, its mirror stops
// answering) this node tries to take the lease: of the followers one wins
// and fetches the rest from upstream for the fleet, listing what it has;
// the others follow it. Every wait ends as Fetch's do: at MaxWait, or an
// API server gone past OutageBound, the pull fetches the rest as it can.
func (g *Gate) follow(ctx context.Context, dg, ref string, l *coordv1.Lease, note func(string), pull Pull) error {
	f := &follower{g: g, dg: dg, ref: ref, p: newPulling(), note: note,
		deadline: time.Now().Add(g.cfg.maxWait), changed: make(chan struct{}), listed: map[string]bool{}}
	f.see(l)
	fctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		f.run(fctx, ctx)
	}()
	err := pull(ctx, f.p.progress, f.await)
	cancel()
	<-ran
	if f.held != nil {
		f.held.end(ctx, err)
	}
	return err
}

// follower is what one node following a holder knows.
type follower struct {
	g        *Gate
	dg, ref  string
	p        *pulling
	note     func(string)
	deadline time.Time

	mu      sync.Mutex
	changed chan struct{} // closed, and replaced, at each change
	listed  map[string]bool
	open    bool     // every layer may be fetched now
	held    *holding // this node took the lease over (set before open)
}

// await is the pull's Await: it returns once a holder listed dg, or the
// follow ended (fetched, taken over, or given up).
func (f *follower) await(ctx context.Context, dg string) error {
	for {
		f.mu.Lock()
		if f.open || f.listed[dg] {
			f.mu.Unlock()
			return nil
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// see takes in the layers lease l lists.
func (f *follower) see(l *coordv1.Lease) {
	s := l.Annotations[AnnotLayers]
	if s == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	grew := false
	for _, d := range strings.Split(s, ",") {
		if !f.listed[d] {
			f.listed[d], grew = true, true
		}
	}
	if grew {
		close(f.changed)
		f.changed = make(chan struct{})
	}
}

// release opens every layer: why is "" where the holder fetched them or
// this node took over, else why the node fetches from upstream after all.
func (f *follower) release(why string) {
	if why != "" {
		f.g.cfg.logger.Warn("fetching the rest from upstream after all", "ref", f.ref, "reason", why)
		f.note("fetching the rest from upstream: " + why)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.open {
		f.open = true
		close(f.changed)
	}
}

// run follows the digest's leases until the follow ends or ctx does;
// hctx outlives ctx: a lease taken over is held with it, until the pull
// ends.
func (f *follower) run(ctx, hctx context.Context) {
	g := f.g
	seen := map[string]observed{}
	sel := LabelDigest + "=" + digestLabel(f.dg)
	var failingSince time.Time
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		if !time.Now().Before(f.deadline) {
			f.release(fmt.Sprintf("waited %s, the bound (max wait), for another node's fetch", g.cfg.maxWait))
			return
		}
		list, err := g.leases.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) >= g.cfg.outageBound && ctx.Err() == nil {
				f.release(fmt.Sprintf("the API server did not answer for %s while following another node's fetch (%v)",
					time.Since(failingSince).Truncate(time.Second), err))
				return
			}
			if kubelease.Sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(backoff*2, g.cfg.renewEvery)
			continue
		}
		failingSince, backoff = time.Time{}, 200*time.Millisecond
		slots := g.slotsOf(f.dg, list.Items)
		v := g.judge(slots, seen, time.Now())
		if v.fetchedBy != "" {
			f.note("pulling through the mirror: " + v.fetchedBy + " fetched " + short(f.dg))
			f.release("")
			return
		}
		for _, s := range v.free {
			l, err := g.take(ctx, f.dg, f.ref, s, slots[s])
			if err != nil {
				if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
					g.cfg.logger.Debug("lease not taken", "lease", LeaseName(f.dg, s), "err", err)
				}
				continue
			}
			f.note("fetching the rest of " + short(f.dg) + " from upstream for the fleet (took over lease " + g.namespace + "/" + l.Name + ")")
			f.mu.Lock()
			f.held = g.startHolding(hctx, f.ref, l, f.p)
			f.mu.Unlock()
			f.release("")
			return
		}
		if len(v.free) > 0 {
			continue // another node took it first: read again
		}
		for _, l := range slots {
			if l != nil && kubelease.Holder(l) != "" {
				f.see(l)
			}
		}
		until := v.recheck
		if until.After(f.deadline) || until.IsZero() {
			until = f.deadline
		}
		err = g.watchUntil(ctx, f.dg, sel, list.ResourceVersion, seen, until, func(l *coordv1.Lease, v verdict) bool {
			f.see(l)
			return v.fetchedBy != "" || v.seenFree
		})
		if err != nil {
			return
		}
	}
}
