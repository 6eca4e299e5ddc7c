package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Progress is how far a pull has got.
type Progress struct {
	Ref        string
	Done       int64 // bytes of layers fetched
	Total      int64 // bytes of layers known so far
	Layers     int
	LayersDone int
	Finished   bool
}

// Pulled is an image that is in the content store and unpacked.
type Pulled struct {
	Name   string // the image record's name: the digested reference
	Digest string
	Size   int64
	// Created is true when this pull made the record; false when a record
	// (a pin, perhaps) already held it and nothing was fetched.
	Created bool
}

// PullOptions tunes one pull.
type PullOptions struct {
	Platform string
	Progress func(Progress)
	// Labels go on a record this pull creates.
	Labels map[string]string
}

// Pull fetches ref (a repo@sha256 reference) and unpacks it into the
// snapshotter. An existing record of that name is reused as it is: Pull
// would replace its labels, and those labels may be a pin.
func (r *Runtime) Pull(ctx context.Context, ref string, opts PullOptions) (Pulled, error) {
	ctx = r.ctx(ctx)
	matcher := platforms.Default()
	if opts.Platform != "" {
		p, err := platforms.Parse(opts.Platform)
		if err != nil {
			return Pulled{}, fmt.Errorf("platform %q: %w", opts.Platform, err)
		}
		matcher = platforms.Only(p)
	}
	if rec, err := r.client.ImageService().Get(ctx, ref); err == nil {
		img := client.NewImageWithPlatform(r.client, rec, matcher)
		unpacked, err := img.IsUnpacked(ctx, r.snapshotter)
		if err == nil && !unpacked {
			err = img.Unpack(ctx, r.snapshotter)
		}
		if err == nil {
			return Pulled{Name: rec.Name, Digest: rec.Target.Digest.String(), Size: rec.Target.Size}, nil
		}
		// Content gone under an existing record: fetch again, under a lease,
		// without touching the record's labels.
	} else if !errdefs.IsNotFound(err) {
		return Pulled{}, fmt.Errorf("look up %s: %w", ref, err)
	}

	labels := map[string]string{LabelManaged: "true", LabelRole: "candidate", LabelOwner: owner}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	tracker := newTracker(r.client.ContentStore(), ref, opts.Progress)
	stop := tracker.start(ctx)
	img, err := r.client.Pull(ctx, ref,
		client.WithResolver(r.resolver(ctx)),
		client.WithPlatformMatcher(matcher),
		client.WithPullUnpack,
		client.WithPullSnapshotter(r.snapshotter),
		client.WithPullLabels(labels),
		client.WithImageHandler(images.HandlerFunc(tracker.observe)),
		client.WithMaxConcurrentDownloads(4),
	)
	stop(err == nil)
	if err != nil {
		return Pulled{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	t := img.Target()
	return Pulled{Name: img.Name(), Digest: t.Digest.String(), Size: t.Size, Created: true}, nil
}

// WithLease runs fn under a lease that keeps what it fetches and creates
// until it returns; the lease is labelled so a sweep removes it if this
// process dies first.
func (r *Runtime) WithLease(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx = r.ctx(ctx)
	ls := r.client.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour),
		leases.WithLabels(map[string]string{LabelManaged: "true", LabelOwner: owner}))
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		ls.Delete(dctx, l)
	}()
	return fn(leases.WithLease(ctx, l.ID))
}

// tracker follows a pull: the layers the handler saw, and the content
// store's in-flight writes.
type tracker struct {
	cs     content.Store
	ref    string
	report func(Progress)

	mu     sync.Mutex
	layers map[string]int64
	done   map[string]bool
}

func newTracker(cs content.Store, ref string, report func(Progress)) *tracker {
	return &tracker{cs: cs, ref: ref, report: report, layers: map[string]int64{}, done: map[string]bool{}}
}

func (t *tracker) observe(_ context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	if images.IsLayerType(d.MediaType) {
		t.mu.Lock()
		t.layers[d.Digest.String()] = d.Size
		t.mu.Unlock()
	}
	return nil, nil
}

func (t *tracker) start(ctx context.Context) func(ok bool) {
	if t.report == nil {
		return func(bool) {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				t.report(t.snapshot(ctx))
			}
		}
	}()
	return func(ok bool) {
		close(done)
		wg.Wait()
		p := t.snapshot(ctx)
		p.Finished = ok
		if ok {
			p.Done, p.LayersDone = p.Total, p.Layers
		}
		t.report(p)
	}
}

func (t *tracker) snapshot(ctx context.Context) Progress {
	active := map[string]int64{}
	if st, err := t.cs.ListStatuses(ctx); err == nil {
		for _, s := range st {
			active[s.Expected.String()] = s.Offset
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := Progress{Ref: t.ref, Layers: len(t.layers)}
	for dg, size := range t.layers {
		p.Total += size
		if !t.done[dg] {
			if off, ok := active[dg]; ok {
				p.Done += off
				continue
			}
			if _, err := t.cs.Info(ctx, digestOf(dg)); err == nil {
				t.done[dg] = true
			} else if !errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
		}
		if t.done[dg] {
			p.Done += size
			p.LayersDone++
		}
	}
	return p
}

// ImageConfig returns the config of an image record for the platform.
func (r *Runtime) ImageConfig(ctx context.Context, name, platform string) (ocispec.ImageConfig, error) {
	ctx = r.ctx(ctx)
	rec, err := r.client.ImageService().Get(ctx, name)
	if err != nil {
		return ocispec.ImageConfig{}, fmt.Errorf("image %s: %w", name, err)
	}
	matcher := platforms.Default()
	if platform != "" {
		if p, err := platforms.Parse(platform); err == nil {
			matcher = platforms.Only(p)
		}
	}
	spec, err := client.NewImageWithPlatform(r.client, rec, matcher).Spec(ctx)
	if err != nil {
		return ocispec.ImageConfig{}, fmt.Errorf("config of %s: %w", name, err)
	}
	return spec.Config, nil
}
