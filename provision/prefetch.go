package provision

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
)

// WithPrefetch overlaps a fallback with the probe it follows: while
// candidate N is probed, candidate N+1's layers are already fetched and
// unpacked (containerd.Prefetch), so a candidate that fails its probe costs
// the probe, not a second full pull. It is off by default: the prefetch
// takes bandwidth, CPU and disk while the probe runs, and is thrown away
// whenever the first candidate passes, which is the common case. maxBytes
// bounds the compressed layers of a candidate prefetched; the runtime also
// declines when the snapshot disk lacks about four times that room free.
// 0 turns it off.
func WithPrefetch(maxBytes int64) Option {
	return func(c *config) error {
		if maxBytes < 0 {
			return fmt.Errorf("WithPrefetch(%d): a negative bound; 0 turns prefetch off", maxBytes)
		}
		c.Prefetch = maxBytes
		return nil
	}
}

// Prefetcher fetches and unpacks a candidate ahead of its turn; release
// lets go of what it holds.
type Prefetcher interface {
	Prefetch(ctx context.Context, ref string, opts containerd.PullOptions, maxBytes int64) (func(), error)
}

// prefetcher runs one provision's prefetches: at most one, of the
// candidate after the one being probed.
type prefetcher struct {
	rt       Prefetcher
	ctx      context.Context
	cands    []images.Candidate
	platform string
	maxBytes int64
	log      func(msg string, args ...any)

	mu       sync.Mutex
	cur      int // the candidate being tried
	next     int // the candidate being prefetched, -1 for none
	cancel   context.CancelFunc
	done     chan struct{}
	releases []func()
}

type prefetchKey struct{}

// prefetchFor makes the provision's prefetcher, nil (which does nothing)
// when WithPrefetch is off or there is no fallback.
func (p *Provisioner) prefetchFor(ctx context.Context, pl *Plan, platform string) *prefetcher {
	if p.opts.Prefetch <= 0 || len(pl.Candidates) < 2 || pl.override.Kind == images.OverrideVariant {
		return nil
	}
	return &prefetcher{rt: p.rt, ctx: ctx, cands: pl.Candidates, platform: platform, maxBytes: p.opts.Prefetch, next: -1,
		log: func(msg string, args ...any) { p.opts.Logger.Info(msg, args...) }}
}

// turn is called before candidate i is tried: a prefetch of it finishes
// first (the pull then finds what it fetched); one of any other goes.
func (f *prefetcher) turn(ctx context.Context, i int) context.Context {
	if f == nil {
		return ctx
	}
	f.mu.Lock()
	next, done := f.next, f.done
	f.cur = i
	f.mu.Unlock()
	if next >= 0 && done != nil {
		if next != i {
			f.cancel()
		}
		<-done
	}
	return context.WithValue(ctx, prefetchKey{}, f)
}

// probing starts the prefetch of the candidate after the one being probed.
func probing(ctx context.Context) {
	f, _ := ctx.Value(prefetchKey{}).(*prefetcher)
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.cur + 1
	if i >= len(f.cands) || f.next == i {
		return
	}
	c := f.cands[i]
	pctx, cancel := context.WithCancel(f.ctx)
	f.next, f.cancel, f.done = i, cancel, make(chan struct{})
	done := f.done
	go func() {
		defer close(done)
		release, err := f.rt.Prefetch(pctx, c.Ref, containerd.PullOptions{Platform: f.platform, MediaType: c.MediaType}, f.maxBytes)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				f.log("prefetch skipped", "variant", c.Variant, "ref", c.Ref, "reason", err.Error())
			}
			return
		}
		f.mu.Lock()
		f.releases = append(f.releases, release)
		f.mu.Unlock()
	}()
}

// close stops a prefetch in flight and lets go of what prefetches held:
// the candidate that used it has its own record by now.
func (f *prefetcher) close() {
	if f == nil {
		return
	}
	f.mu.Lock()
	cancel, done := f.cancel, f.done
	f.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	for _, r := range f.releases {
		r()
	}
}
