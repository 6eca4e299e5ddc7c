package provision_test

import (
	"context"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/registry"
)

// outside runs work on goroutines outside a synctest bubble. The loop's
// tests reach the real containerd and registry through it: a goroutine in
// the bubble that waits on it is not durably blocked, so the bubble's
// clock stands still while they work, and their connections' goroutines
// stay out of the bubble (one waiting on a socket would stop its clock for
// good). Made outside the bubble; used from inside it.
type outside struct {
	calls chan func()
	// dones hands out channels made outside the bubble: one made inside
	// it could not be closed from here.
	dones chan chan struct{}
}

func newOutside(t *testing.T) *outside {
	o := &outside{calls: make(chan func()), dones: make(chan chan struct{})}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case fn := <-o.calls:
				go fn()
			case o.dones <- make(chan struct{}):
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop) })
	return o
}

// start runs fn outside and returns a channel closed when it is done.
func (o *outside) start(fn func()) <-chan struct{} {
	done := <-o.dones
	o.calls <- func() { defer close(done); fn() }
	return done
}

// do runs fn outside and waits for it.
func (o *outside) do(fn func()) { <-o.start(fn) }

// call runs fn outside with ctx's values, cancelled when ctx ends.
func (o *outside) call(ctx context.Context, fn func(ctx context.Context)) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := o.start(func() { fn(octx) })
	select {
	case <-done:
	case <-ctx.Done():
		cancel()
		<-done
	}
}

// outsideRuntime is a containerd.Runtime whose calls run outside the bubble.
type outsideRuntime struct {
	rt *containerd.Runtime
	o  *outside
}

func (r outsideRuntime) Namespace() string { return r.rt.Namespace() }

func (r outsideRuntime) Pins(ctx context.Context) (pins []containerd.Pin, err error) {
	r.o.call(ctx, func(ctx context.Context) { pins, err = r.rt.Pins(ctx) })
	return pins, err
}

func (r outsideRuntime) ListPins(ctx context.Context) (pins []containerd.Pin, err error) {
	r.o.call(ctx, func(ctx context.Context) { pins, err = r.rt.ListPins(ctx) })
	return pins, err
}

func (r outsideRuntime) Registry() *registry.Policy { return r.rt.Registry() }

func (r outsideRuntime) Prefetch(ctx context.Context, ref string, opts containerd.PullOptions, maxBytes int64) (release func(), err error) {
	r.o.call(ctx, func(ctx context.Context) { release, err = r.rt.Prefetch(ctx, ref, opts, maxBytes) })
	return release, err
}

func (r outsideRuntime) PreviousPins(ctx context.Context) (pins []containerd.Pin, err error) {
	r.o.call(ctx, func(ctx context.Context) { pins, err = r.rt.PreviousPins(ctx) })
	return pins, err
}

func (r outsideRuntime) SetPin(ctx context.Context, p containerd.Pin, opts containerd.SetPinOptions) (err error) {
	r.o.call(ctx, func(ctx context.Context) { err = r.rt.SetPin(ctx, p, opts) })
	return err
}

func (r outsideRuntime) Pull(ctx context.Context, ref string, opts containerd.PullOptions) (p containerd.Pulled, err error) {
	r.o.call(ctx, func(ctx context.Context) { p, err = r.rt.Pull(ctx, ref, opts) })
	return p, err
}

func (r outsideRuntime) ImageConfig(ctx context.Context, name, platform string) (c ocispec.ImageConfig, err error) {
	r.o.call(ctx, func(ctx context.Context) { c, err = r.rt.ImageConfig(ctx, name, platform) })
	return c, err
}

func (r outsideRuntime) Run(ctx context.Context, spec containerd.RunSpec) (res containerd.RunResult, err error) {
	r.o.call(ctx, func(ctx context.Context) { res, err = r.rt.Run(ctx, spec) })
	return res, err
}

func (r outsideRuntime) DiscardCandidate(ctx context.Context, name string) (err error) {
	r.o.call(ctx, func(ctx context.Context) { err = r.rt.DiscardCandidate(ctx, name) })
	return err
}

func (r outsideRuntime) Sweep(ctx context.Context) (s containerd.Swept, err error) {
	r.o.call(ctx, func(ctx context.Context) { s, err = r.rt.Sweep(ctx) })
	return s, err
}

// WithLease takes the lease outside and runs fn inside, with the lease's
// values and ctx's cancellation.
func (r outsideRuntime) WithLease(ctx context.Context, fn func(context.Context) error) error {
	var (
		leased       context.Context
		err, fnErr   error
		got, fnDone  = <-r.o.dones, <-r.o.dones
		leaseRelease <-chan struct{}
	)
	leaseRelease = r.o.start(func() {
		err = r.rt.WithLease(context.WithoutCancel(ctx), func(lctx context.Context) error {
			leased = lctx
			close(got)
			<-fnDone
			return fnErr
		})
	})
	select {
	case <-got:
	case <-leaseRelease:
		return err // no lease
	}
	fnErr = fn(valuesFrom{ctx, leased})
	close(fnDone)
	<-leaseRelease
	return err
}

// valuesFrom is ctx with the values of vals beneath its own.
type valuesFrom struct {
	context.Context
	vals context.Context
}

func (c valuesFrom) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.vals.Value(key)
}

// outsideResolver resolves outside the bubble.
type outsideResolver struct {
	r *images.Resolver
	o *outside
}

func (r outsideResolver) ResolveReference(ctx context.Context, ref images.Reference) (set *images.Set, err error) {
	r.o.call(ctx, func(ctx context.Context) { set, err = r.r.ResolveReference(ctx, ref) })
	return set, err
}
