package pull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/gpupin/gpupin/registry"

	"github.com/gpupin/gpupin/containerd/conn"
)

// ErrNoRoomToPrefetch is Prefetch declining: the image is larger than the
// caller allows, or the disk under containerd's snapshots lacks the room.
var ErrNoRoomToPrefetch = errors.New("no room to prefetch")

// prefetchExpansion is what a layer is assumed to take unpacked, per byte
// of its compressed size, beside the compressed blob itself (real image
// content compresses 2–3×).
const prefetchExpansion = 4

// Prefetch fetches and unpacks ref (a repo@sha256 image manifest) ahead of
// its Pull, which then finds its content and snapshots in place and only
// makes the record: a provision fetches the next candidate while the one
// before it is probed, so a failed probe costs a probe, not a second full
// pull. Nothing is fetched when the image's layers exceed maxBytes or the
// snapshot filesystem (where this process sees it) has less than about
// four times their size free: then ErrNoRoomToPrefetch, and the Pull does
// it all as usual. What it fetched is held under a lease of its own until
// release is called (or for an hour, should the process die).
func (r *Puller) Prefetch(ctx context.Context, ref string, opts PullOptions, maxBytes int64) (release func(), err error) {
	ctx = registry.LogContext(r.conn.Ctx(ctx))
	size, err := r.layerBytes(ctx, ref, opts.MediaType)
	if err != nil {
		return nil, fmt.Errorf("prefetch %s: %w", ref, err)
	}
	if size > maxBytes {
		return nil, fmt.Errorf("prefetch %s: %w: its layers are %d bytes, more than the %d allowed", ref, ErrNoRoomToPrefetch, size, maxBytes)
	}
	if free, ok := r.snapshotFree(ctx); ok && free < size*prefetchExpansion {
		return nil, fmt.Errorf("prefetch %s: %w: %d bytes free under the snapshots, %d wanted", ref, ErrNoRoomToPrefetch, free, size*prefetchExpansion)
	}
	ls := r.conn.Client.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(partialTTL),
		leases.WithLabels(map[string]string{conn.LabelManaged: "true", conn.LabelOwner: conn.Owner(), conn.LabelRole: "prefetch", conn.LabelSource: ref}))
	if err != nil {
		return nil, fmt.Errorf("prefetch %s: create lease: %w", ref, err)
	}
	release = func() {
		// Not synchronous: what the next Pull took over stays; the rest
		// is collected whenever containerd next collects.
		conn.Cleanup(ctx, func(ctx context.Context) error { return ls.Delete(ctx, l) })
	}
	opts.prefetch = true
	if _, err := r.Pull(leases.WithLease(ctx, l.ID), ref, opts); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// layerBytes reads ref's manifest and sums its layers' sizes.
func (r *Puller) layerBytes(ctx context.Context, ref, mediaType string) (int64, error) {
	res := r.resolver(ctx)
	name, desc, err := res.Resolve(ctx, ref)
	if err != nil {
		return 0, err
	}
	if err := checkMediaType(ref, mediaType, desc.MediaType); err != nil {
		return 0, err
	}
	if !images.IsManifestType(desc.MediaType) {
		return 0, fmt.Errorf("%s is %s, not an image manifest", ref, desc.MediaType)
	}
	f, err := res.Fetcher(ctx, name)
	if err != nil {
		return 0, err
	}
	rc, err := f.Fetch(ctx, desc)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	// The sizes decide whether the disk has room: they count only from
	// the manifest the reference names.
	data, err := io.ReadAll(io.LimitReader(rc, 4<<20))
	if err != nil {
		return 0, fmt.Errorf("manifest: %w", err)
	}
	if got := digest.FromBytes(data); got != desc.Digest {
		return 0, fmt.Errorf("manifest: the registry sent %s for %s", got, desc.Digest)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return 0, fmt.Errorf("manifest: %w", err)
	}
	var n int64
	for _, l := range m.Layers {
		if l.Size < 0 || l.Size > math.MaxInt64/prefetchExpansion-n {
			return 0, fmt.Errorf("manifest: layer %s reports a size of %d", l.Digest, l.Size)
		}
		n += l.Size
	}
	return n, nil
}

// snapshotFree is the free space under the snapshotter's root, when this
// process sees that directory.
func (r *Puller) snapshotFree(ctx context.Context) (int64, bool) {
	resp, err := r.conn.Client.IntrospectionService().Plugins(ctx, fmt.Sprintf("type==%s, id==%s", plugins.SnapshotPlugin, r.conn.Snapshotter))
	if err != nil || len(resp.Plugins) == 0 {
		return 0, false
	}
	root := resp.Plugins[0].Exports[plugins.SnapshotterRootDir]
	var st unix.Statfs_t
	if root == "" || unix.Statfs(root, &st) != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
