package canary

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpupin/gpupin/internal/kubelease"
	"github.com/gpupin/gpupin/provision"
)

var _ provision.Canary = (*Gate)(nil)

// Await returns when this node may try key's candidates (provision.Canary).
func (g *Gate) Await(ctx context.Context, class, key string, note func(canary string)) (provision.CanaryVerdict, func(), error) {
	name := LeaseName(class, key)
	start := g.now()
	deadline := start.Add(g.maxWait)
	var lastOK time.Time = start
	noted := ""
	for {
		if err := ctx.Err(); err != nil {
			return provision.CanaryVerdict{}, nil, err
		}
		now := g.now()
		if now.After(deadline) {
			return provision.CanaryVerdict{Reason: fmt.Sprintf("no verdict from canary %s within %s", noted, g.maxWait)}, nil, nil
		}
		l, err := g.leases.Leases(g.namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			l, err = g.create(ctx, name, class, key)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err == nil {
				return g.lead(ctx, l, key)
			}
		}
		if err != nil {
			// The canary only saves doomed attempts: an API that does
			// not answer is no reason to wait longer than a dead
			// canary would cost.
			if now.Sub(lastOK) > g.leaseDuration {
				return provision.CanaryVerdict{Reason: fmt.Sprintf("the Kubernetes API did not answer for %s: %v", g.leaseDuration, err)}, nil, nil
			}
			if err := kubelease.Sleep(ctx, time.Second); err != nil {
				return provision.CanaryVerdict{}, nil, err
			}
			continue
		}
		lastOK = now
		holder := kubelease.Holder(l)
		state := l.Annotations[AnnotationState]
		switch {
		case state == stateDone && holder != "":
			v, ok, err := g.verdict(ctx, holder, key, kubelease.Acquired(l))
			if err == nil && ok {
				return v, nil, nil
			}
			// The status that held the verdict is gone (a node removed,
			// a newer provision over it): this node proves.
			g.log.Info("canary's verdict no longer in its status; proving here", "key", key, "canary", holder, "err", err)
			fallthrough
		case state == stateReleased, holder == g.identity, g.expired(l, now):
			taken, err := g.take(ctx, l, class, key)
			if err == nil {
				return g.lead(ctx, taken, key)
			}
			if !apierrors.IsConflict(err) {
				g.log.Warn("canary lease not taken", "lease", name, "err", err)
				if err := kubelease.Sleep(ctx, time.Second); err != nil {
					return provision.CanaryVerdict{}, nil, err
				}
			}
			continue
		}
		if holder != noted {
			noted = holder
			note(holder)
		}
		until := kubelease.Renewed(l).Add(g.leaseDuration)
		if until.After(deadline) {
			until = deadline
		}
		g.watch(ctx, name, l.ResourceVersion, until)
	}
}

// watch returns when the lease changes, until passes, or ctx ends: one
// watch request per lease duration, however long the canary takes.
func (g *Gate) watch(ctx context.Context, name, rv string, until time.Time) {
	d := time.Until(until) + 100*time.Millisecond
	if d <= 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	secs := int64(d/time.Second) + 1
	w, err := g.leases.Leases(g.namespace).Watch(wctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv, TimeoutSeconds: &secs})
	if err != nil {
		_ = kubelease.Sleep(wctx, time.Second)
		return
	}
	defer w.Stop()
	select {
	case <-w.ResultChan():
	case <-wctx.Done():
	}
}

func (g *Gate) create(ctx context.Context, name, class, key string) (*coordv1.Lease, error) {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.namespace,
		Labels:      map[string]string{LabelCanary: "true"},
		Annotations: map[string]string{AnnotationClass: class, AnnotationKey: key}}}
	g.hold(l)
	return g.leases.Leases(g.namespace).Create(ctx, l, metav1.CreateOptions{})
}

// take makes this node the holder of l, if l is still as it was read.
func (g *Gate) take(ctx context.Context, l *coordv1.Lease, class, key string) (*coordv1.Lease, error) {
	l = l.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationClass], l.Annotations[AnnotationKey] = class, key
	if kubelease.Holder(l) != g.identity {
		n := int32(1)
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions + 1
		}
		l.Spec.LeaseTransitions = &n
	}
	g.hold(l)
	return g.leases.Leases(g.namespace).Update(ctx, l, metav1.UpdateOptions{})
}

func (g *Gate) hold(l *coordv1.Lease) {
	now := metav1.NewMicroTime(g.now())
	secs := int32(g.leaseDuration / time.Second)
	id := g.identity
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &id, &secs
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationState] = stateProving
}

// lead is this node as its class's canary: the lease is renewed until
// done, or until ctx (the provision) ends, as it does when the node dies;
// done waits for this node's status to show key's outcome, then
// marks the lease done (or released, when the status never showed it).
func (g *Gate) lead(ctx context.Context, l *coordv1.Lease, key string) (provision.CanaryVerdict, func(), error) {
	g.log.Info("canary for its GPU class", "key", key, "class", l.Annotations[AnnotationClass], "lease", l.Name)
	stop := make(chan struct{})
	var mu sync.Mutex
	cur := l
	go func() {
		t := time.NewTicker(g.leaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			next := cur.DeepCopy()
			now := metav1.NewMicroTime(g.now())
			next.Spec.RenewTime = &now
			ctx, cancel := context.WithTimeout(context.Background(), g.leaseDuration/3)
			upd, err := g.leases.Leases(g.namespace).Update(ctx, next, metav1.UpdateOptions{})
			cancel()
			if err == nil {
				cur = upd
			} else if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				// Taken over (this node was seen as dead): the other
				// node proves too; nothing here is wrong for it.
				g.log.Warn("canary lease lost", "lease", cur.Name, "err", err)
				mu.Unlock()
				return
			}
			mu.Unlock()
		}
	}()
	since := kubelease.Acquired(l)
	var once sync.Once
	done := func() {
		once.Do(func() {
			close(stop)
			state := stateReleased
			ctx, cancel := context.WithTimeout(context.Background(), g.statusWait)
			defer cancel()
			for {
				_, ok, err := g.verdict(ctx, g.identity, key, since)
				if ok {
					state = stateDone
					break
				}
				if kubelease.Sleep(ctx, time.Second) != nil {
					g.log.Warn("canary's outcome not seen in its GPUPinNode status; lease released without a verdict", "key", key, "within", g.statusWait, "err", err)
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			next := cur.DeepCopy()
			next.Annotations[AnnotationState] = state
			now := metav1.NewMicroTime(g.now())
			next.Spec.RenewTime = &now
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			if _, err := g.leases.Leases(g.namespace).Update(wctx, next, metav1.UpdateOptions{}); err != nil {
				g.log.Warn("canary lease not marked "+state+"; it expires within its duration", "lease", cur.Name, "err", err)
			}
		})
	}
	return provision.CanaryVerdict{}, done, nil
}

func (g *Gate) expired(l *coordv1.Lease, now time.Time) bool {
	d := g.leaseDuration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.After(kubelease.Renewed(l).Add(d))
}
