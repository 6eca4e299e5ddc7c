package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/registry"
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
	// MediaType is what the reference was described as (the index
	// entry's media type); the pull refuses an index where an image
	// manifest was expected, and the reverse, before fetching anything
	// below the root. "" checks nothing.
	MediaType string

	// prefetch fetches and unpacks under the caller's lease and makes no
	// image record (Prefetch).
	prefetch bool
}

// Pull fetches ref (a repo@sha256 reference) and unpacks it into the
// snapshotter. It never writes over an existing record of that name:
// containerd's Pull would replace that record's labels, and those labels
// may be a pin. So the pull lands under a staging name of its own, and the
// real record is then created, never updated.
func (r *Runtime) Pull(ctx context.Context, ref string, opts PullOptions) (Pulled, error) {
	ctx = registry.LogContext(r.ctx(ctx))
	if _, ok := leases.FromContext(ctx); !ok {
		// A lease of our own, so a failed pull can hand what it fetched to
		// the next attempt (keepPartial).
		var p Pulled
		err := r.WithLease(ctx, func(ctx context.Context) error {
			var err error
			p, err = r.Pull(ctx, ref, opts)
			return err
		})
		return p, err
	}
	matcher := platforms.Default()
	if opts.Platform != "" {
		p, err := platforms.Parse(opts.Platform)
		if err != nil {
			return Pulled{}, fmt.Errorf("platform %q: %w", opts.Platform, err)
		}
		matcher = platforms.Only(p)
	}
	if rec, err := r.client.ImageService().Get(ctx, ref); err == nil {
		if tampered(rec) {
			// Its name says one image and it holds another: neither used
			// nor overwritten (it may be evidence); gc removes it.
			return Pulled{}, fmt.Errorf("pull %s: %w: the record points at %s, not the digest its name says; it was changed outside gpupin: gpupin gc removes it", ref, ErrTampered, rec.Target.Digest)
		}
		if err := checkMediaType(ref, opts.MediaType, rec.Target.MediaType); err != nil {
			return Pulled{}, err
		}
		img := client.NewImageWithPlatform(r.client, rec, matcher)
		unpacked, err := img.IsUnpacked(ctx, r.snapshotter)
		if err == nil && !unpacked {
			err = img.Unpack(ctx, r.snapshotter)
		}
		if err == nil {
			return Pulled{Name: rec.Name, Digest: rec.Target.Digest.String(), Size: rec.Target.Size}, nil
		}
		// Content gone under an existing record: fetch again, under the
		// staging name; the record is left as it is.
	} else if !errdefs.IsNotFound(err) {
		return Pulled{}, fmt.Errorf("look up %s: %w", ref, err)
	}

	labels := map[string]string{LabelManaged: "true", LabelCreated: "true", LabelRole: "candidate", LabelOwner: owner}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	tracker := newTracker(r.client.ContentStore(), ref, opts.Progress)
	stop := tracker.start(ctx)
	staging := ref + stagingSuffix + randomHex(8)
	is := r.client.ImageService()
	// Whatever happens from here, the staging record goes: containerd may
	// have made it even when its Pull fails (an unpack after the record).
	defer cleanup(ctx, func(ctx context.Context) error { return is.Delete(ctx, staging) })
	sr := &stagingResolver{Resolver: r.resolver(ctx), alias: staging, real: ref, mediaType: opts.MediaType}
	strategy, err := r.strategy(ctx)
	if err != nil {
		stop(false)
		return Pulled{}, err
	}
	pullOpts := append([]client.RemoteOpt{
		client.WithResolver(sr),
		client.WithPlatformMatcher(matcher),
		client.WithPullSnapshotter(r.snapshotter),
		client.WithPullLabels(labels),
		client.WithImageHandler(images.HandlerFunc(tracker.observe)),
		client.WithMaxConcurrentDownloads(4),
	}, r.unpackOpts(strategy, r.newUnpacker(strategy, sr, staging, tracker))...)
	img, err := r.client.Pull(ctx, staging, pullOpts...)
	stop(err == nil)
	if err != nil && sr.refused != nil {
		// Not what the caller was told it is: said plainly, without
		// containerd's wrapping, and nothing is kept for a retry.
		return Pulled{}, sr.refused
	}
	if err != nil {
		err = r.registry.Explain(fmt.Errorf("pull %s: %w", ref, err), refHost(ref))
		if worthKeeping(err) && !opts.prefetch {
			if kerr := r.keepPartial(context.WithoutCancel(ctx), ref); kerr != nil {
				err = fmt.Errorf("%w (and what it fetched is not kept for the next attempt: %v)", err, kerr)
			}
		}
		return Pulled{}, err
	}
	// containerd skips unpacking a layer whose snapshot exists, without
	// taking a reference to it; a collection running meanwhile may have
	// removed it. Check, and unpack again under this pull's lease if so.
	if ok, err := img.IsUnpacked(ctx, r.snapshotter); err == nil && !ok {
		if err := img.Unpack(ctx, r.snapshotter); err != nil {
			return Pulled{}, fmt.Errorf("pull %s: unpack: %w", ref, err)
		}
	}
	t := img.Target()
	if opts.prefetch {
		// Content and snapshots stay under the caller's lease; the pull
		// that follows finds them and makes the record.
		return Pulled{Name: ref, Digest: t.Digest.String(), Size: t.Size}, nil
	}
	created := true
	if _, err := is.Create(ctx, images.Image{Name: ref, Target: t, Labels: labels}); errdefs.IsAlreadyExists(err) {
		// Made meanwhile by another provision (perhaps pinned already): it
		// is theirs, and stays as it is.
		created = false
	} else if err != nil {
		return Pulled{}, fmt.Errorf("pull %s: create the image record: %w", ref, err)
	}
	// The record holds everything now; an earlier failure's keep is done.
	// Best effort: the lease expires by itself.
	r.client.LeasesService().Delete(context.WithoutCancel(ctx), leases.Lease{ID: partialLeaseID(ref)})
	return Pulled{Name: ref, Digest: t.Digest.String(), Size: t.Size, Created: created}, nil
}

// stagingSuffix names the records pulls land under before the real one is
// created; a sweep removes any a dead process left. It is a URL fragment
// of the reference, so containerd still reads the real registry and
// repository from the name (for its distribution-source labels).
const stagingSuffix = "#gpupin-staging-"

// stagingResolver resolves and fetches the staging name as the real
// reference, so containerd's Pull names its record after the staging name.
// It also checks the root's media type (see checkMediaType): the resolve
// is the first thing a pull does, so a refusal there fetches nothing more.
type stagingResolver struct {
	remotes.Resolver
	alias, real string
	mediaType   string // expected; "" = any
	refused     error  // set when the root's media type was refused
}

func (s *stagingResolver) Resolve(ctx context.Context, ref string) (string, ocispec.Descriptor, error) {
	if ref != s.alias {
		return s.Resolver.Resolve(ctx, ref)
	}
	_, desc, err := s.Resolver.Resolve(ctx, s.real)
	if err == nil {
		if err = checkMediaType(s.real, s.mediaType, desc.MediaType); err != nil {
			s.refused = err
		}
	}
	return s.alias, desc, err
}

func (s *stagingResolver) Fetcher(ctx context.Context, ref string) (remotes.Fetcher, error) {
	if ref == s.alias {
		ref = s.real
	}
	return s.Resolver.Fetcher(ctx, ref)
}

// SetOptions passes Pull's download options (concurrency) on.
func (s *stagingResolver) SetOptions(opts ...transfer.ImageResolverOption) {
	if r, ok := s.Resolver.(remotes.ResolverWithOptions); ok {
		r.SetOptions(opts...)
	}
}

// leaseTTL bounds a lease: what a process that vanished left under it goes
// after this long even if no sweep sees it.
const leaseTTL = 24 * time.Hour

// WithLease runs fn under a lease that keeps what it fetches and creates
// until it returns; the lease is labelled so a sweep removes it if this
// process dies first.
func (r *Runtime) WithLease(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx = r.ctx(ctx)
	ls := r.client.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(leaseTTL),
		leases.WithLabels(map[string]string{LabelManaged: "true", LabelOwner: owner}))
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	// Synchronous: what this lease alone held is collected before the
	// caller goes on. Left to a later collection, it can vanish under the
	// next pull, which found it present and so did not unpack it again.
	defer cleanup(ctx, func(ctx context.Context) error { return ls.Delete(ctx, l, leases.SynchronousDelete) })
	return fn(leases.WithLease(ctx, l.ID))
}

// partialTTL is how long what a failed pull fetched is kept for a retry;
// containerd's collector drops the lease after it.
const partialTTL = time.Hour

// partialLeaseID names the lease that keeps what failed pulls of ref fetched.
func partialLeaseID(ref string) string {
	h := sha256.Sum256([]byte(ref))
	return "gpupin-partial-" + hex.EncodeToString(h[:8])
}

// worthKeeping tells a pull that may succeed on retry (the registry or the
// network failed) from one that will not: content that lies about its
// digest or size, or a full disk, whose partial data only takes space.
func worthKeeping(err error) bool {
	if errdefs.IsFailedPrecondition(err) || errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) {
		return false
	}
	if strings.Contains(err.Error(), "media-type: expected") {
		// containerd found a manifest whose body is not of the type the
		// registry said: the same bytes will fail the same way.
		return false
	}
	return !strings.Contains(err.Error(), "no space left on device")
}

// keepPartial moves what the pull's lease holds (whole blobs, partial
// downloads, unpacked snapshots) under a lease of its own that outlives
// the attempt. Without it the attempt's lease is deleted, the collector
// frees the layers, and the next attempt fetches them again; worse, it
// may find a snapshot the collector is about to remove and fail on
// "parent snapshot does not exist".
func (r *Runtime) keepPartial(ctx context.Context, ref string) error {
	cur, ok := leases.FromContext(ctx)
	if !ok {
		return nil
	}
	ls := r.client.LeasesService()
	res, err := ls.ListResources(ctx, leases.Lease{ID: cur})
	if err != nil {
		return fmt.Errorf("list what the pull fetched: %w", err)
	}
	if len(res) == 0 {
		return nil
	}
	l, err := ls.Create(ctx, leases.WithID(partialLeaseID(ref)), leases.WithExpiration(partialTTL),
		leases.WithLabels(map[string]string{LabelManaged: "true", LabelRole: "partial", LabelSource: ref}))
	if errdefs.IsAlreadyExists(err) {
		l, err = leases.Lease{ID: partialLeaseID(ref)}, nil
	}
	if err != nil {
		return fmt.Errorf("create a lease for what the pull fetched: %w", err)
	}
	for _, rs := range res {
		if err := ls.AddResource(ctx, l, rs); err != nil && !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("keep %s %s: %w", rs.Type, rs.ID, err)
		}
	}
	return nil
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
			active[ingestDigest(s)] = s.Offset
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

// ingestDigest is the blob an in-flight write is for. containerd's local
// store does not report Expected, so without the ref ("layer-sha256:…",
// as remotes.MakeRefKey names it) a layer's bytes would count only once
// it is whole, and a slow pull would look stalled.
func ingestDigest(s content.Status) string {
	if s.Expected != "" {
		return s.Expected.String()
	}
	return s.Ref[strings.LastIndexAny(s.Ref, "-@")+1:]
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

// refHost is the registry of a normalised reference.
func refHost(ref string) string {
	host, _, _ := strings.Cut(ref, "/")
	return host
}
