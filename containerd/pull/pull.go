package pull

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/registry"

	"github.com/gpupin/gpupin/containerd/conn"
)

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
	// AwaitLayer, when set, is asked before each layer blob is fetched and
	// returns once the blob may be fetched (the fetch gate: once a peer
	// holds it, so the node's mirror serves it); an error fails the pull.
	// It never holds a download slot, so a layer that is ready is not held
	// up behind one that is not.
	AwaitLayer func(ctx context.Context, layer ocispec.Descriptor) error

	// prefetch fetches and unpacks under the caller's lease and makes no
	// image record (Prefetch).
	prefetch bool
}

// Pull fetches ref (a repo@sha256 reference) and unpacks it into the
// snapshotter. It never writes over an existing record of that name:
// containerd's Pull would replace that record's labels, and those labels
// may be a pin. So the pull lands under a staging name of its own, and the
// real record is then created, never updated.
func (r *Puller) Pull(ctx context.Context, ref string, opts PullOptions) (Pulled, error) {
	ctx = registry.LogContext(r.conn.Ctx(ctx))
	if _, ok := leases.FromContext(ctx); !ok {
		// A lease of our own, so a failed pull can hand what it fetched to
		// the next attempt (keepPartial).
		var p Pulled
		err := r.conn.WithLease(ctx, func(ctx context.Context) error {
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
	if p, ok, err := r.fromRecord(ctx, ref, opts, matcher); ok || err != nil {
		return p, err
	}

	labels := map[string]string{conn.LabelManaged: "true", conn.LabelCreated: "true", conn.LabelRole: "candidate", conn.LabelOwner: conn.Owner()}
	maps.Copy(labels, opts.Labels)
	tracker := newTracker(r.conn.Client.ContentStore(), ref, opts.Progress)
	stop := tracker.start(ctx)
	staging := ref + stagingSuffix + rand.Text()
	is := r.conn.Client.ImageService()
	// Whatever happens from here, the staging record goes: containerd may
	// have made it even when its Pull fails (an unpack after the record).
	defer conn.Cleanup(ctx, func(ctx context.Context) error { return is.Delete(ctx, staging) })
	sr := &stagingResolver{Resolver: r.resolver(ctx), alias: staging, real: ref, mediaType: opts.MediaType}
	strategy := r.strategy(ctx)
	pullOpts := append([]client.RemoteOpt{
		client.WithResolver(sr),
		client.WithPlatformMatcher(matcher),
		client.WithPullSnapshotter(r.conn.Snapshotter),
		client.WithPullLabels(labels),
		client.WithImageHandler(images.HandlerFunc(tracker.observe)),
		client.WithMaxConcurrentDownloads(4),
	}, r.unpackOpts(strategy, r.newUnpacker(ctx, strategy, sr, staging, ref, tracker, r.storeLayers(ctx, strategy, ref), opts.AwaitLayer))...)
	img, err := r.conn.Client.Pull(ctx, staging, pullOpts...)
	stop(err == nil)
	if err != nil && sr.refused != nil {
		// Not what the caller was told it is: said plainly, without
		// containerd's wrapping, and nothing is kept for a retry.
		return Pulled{}, sr.refused
	}
	if err != nil {
		err = r.conn.Registry.Explain(fmt.Errorf("pull %s: %w", ref, err), refHost(ref))
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
	if ok, err := img.IsUnpacked(ctx, r.conn.Snapshotter); err == nil && !ok {
		if err := img.Unpack(ctx, r.conn.Snapshotter); err != nil {
			if errdefs.IsNotFound(err) {
				err = fmt.Errorf("%w (a snapshot went during the pull, and the layers it extracted were not stored: the next attempt pulls again)", err)
			}
			return Pulled{}, fmt.Errorf("pull %s: unpack: %w", ref, err)
		}
	}
	t := img.Target()
	if opts.prefetch {
		// Content and snapshots stay under the caller's lease; the pull
		// that follows finds them and makes the record.
		return Pulled{Name: ref, Digest: t.Digest.String(), Size: t.Size}, nil
	}
	return r.record(ctx, ref, t, labels)
}

// fromRecord answers a pull from the record already named ref, unpacking it
// where its snapshots went. ok is false where there is no record, or its
// content went: the pull fetches again, and the record is left as it is.
func (r *Puller) fromRecord(ctx context.Context, ref string, opts PullOptions, matcher platforms.MatchComparer) (p Pulled, ok bool, err error) {
	rec, err := r.conn.Client.ImageService().Get(ctx, ref)
	if errdefs.IsNotFound(err) {
		return Pulled{}, false, nil
	}
	if err != nil {
		return Pulled{}, false, fmt.Errorf("look up %s: %w", ref, err)
	}
	if conn.Tampered(rec) {
		// Its name says one image and it holds another: neither used nor
		// overwritten (it may be evidence); gc removes it.
		return Pulled{}, false, fmt.Errorf("pull: %w", conn.TamperedError(ref, rec.Target.Digest))
	}
	if err := checkMediaType(ref, opts.MediaType, rec.Target.MediaType); err != nil {
		return Pulled{}, false, err
	}
	img := client.NewImageWithPlatform(r.conn.Client, rec, matcher)
	unpacked, err := img.IsUnpacked(ctx, r.conn.Snapshotter)
	if err == nil && !unpacked {
		err = img.Unpack(ctx, r.conn.Snapshotter)
	}
	if err != nil {
		return Pulled{}, false, nil
	}
	return Pulled{Name: rec.Name, Digest: rec.Target.Digest.String(), Size: rec.Target.Size}, true, nil
}

// record creates the image record named ref for what was pulled; it never
// updates one, which may be a pin.
func (r *Puller) record(ctx context.Context, ref string, t ocispec.Descriptor, labels map[string]string) (Pulled, error) {
	created := true
	if _, err := r.conn.Client.ImageService().Create(ctx, images.Image{Name: ref, Target: t, Labels: labels}); errdefs.IsAlreadyExists(err) {
		// Made meanwhile by another provision (perhaps pinned already): it
		// is theirs, and stays as it is.
		created = false
	} else if err != nil {
		return Pulled{}, fmt.Errorf("pull %s: create the image record: %w", ref, err)
	}
	// The record holds everything now; an earlier failure's keep is done.
	// Best effort: the lease expires by itself.
	r.conn.Client.LeasesService().Delete(context.WithoutCancel(ctx), leases.Lease{ID: partialLeaseID(ref)})
	return Pulled{Name: ref, Digest: t.Digest.String(), Size: t.Size, Created: created}, nil
}

// stagingSuffix names the records pulls land under before the real one is
// created; a sweep removes any a dead process left. It is a URL fragment
// of the reference, so containerd still reads the real registry and
// repository from the name (for its distribution-source labels).
const stagingSuffix = "#gpupin-staging-"

// partialTTL is how long what a failed pull fetched is kept for a retry;
// containerd's collector drops the lease after it.
const partialTTL = time.Hour

// refHost is the registry of a normalised reference.
func refHost(ref string) string {
	host, _, _ := strings.Cut(ref, "/")
	return host
}
