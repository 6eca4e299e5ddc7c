package pull

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpupin/gpupin/registry"

	"github.com/gpupin/gpupin/containerd/conn"
)

// partialLeaseID names the lease that keeps what failed pulls of ref fetched.
func partialLeaseID(ref string) string {
	h := sha256.Sum256([]byte(ref))
	return "gpupin-partial-" + hex.EncodeToString(h[:8])
}

// worthKeeping tells a pull that may succeed on retry (the registry or the
// network failed) from one that will not: content that lies about its
// digest, size or type, or a full disk, whose partial data only takes
// space. It decides on the error's class, not its wording, so that a
// rewording anywhere in the chain cannot keep a lease that fills the disk.
func worthKeeping(err error) bool {
	switch {
	case diskFull(err),
		errors.Is(err, errWrongDiffID), errors.Is(err, ErrMediaType),
		errdefs.IsFailedPrecondition(err), errdefs.IsInvalidArgument(err), errdefs.IsNotFound(err),
		errdefs.IsResourceExhausted(err), errdefs.IsDataLoss(err):
		return false
	case bodyTypeRefused(err):
		// containerd's own check of a manifest's body against its media
		// type: the same bytes will fail the same way.
		return false
	}
	return true
}

// noSpace are the errnos of a full disk or an exhausted quota.
var noSpace = []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT}

// diskFull reports a full disk: here, as the errno itself; or in the
// daemon, whose errno reaches the client only as its text in a gRPC status
// of code Unknown, so the errno's own text (strerror, the same table on
// both sides) is looked for there and only there.
func diskFull(err error) bool {
	for _, e := range noSpace {
		if errors.Is(err, e) || (unclassedDaemonError(err) && strings.Contains(err.Error(), e.Error())) {
			return true
		}
	}
	return false
}

// unclassedDaemonError reports an error the daemon sent with gRPC code
// Unknown: as the client converts it (errdefs.ErrUnknown), or as it came.
func unclassedDaemonError(err error) bool {
	if errdefs.IsUnknown(err) {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unknown
}

// bodyTypeRefused reports containerd's refusal of a manifest whose body is
// not of the type the registry said (core/images validateMediaType). That
// error has no class or type, so its fixed prefix is all there is to see.
func bodyTypeRefused(err error) bool {
	return strings.Contains(err.Error(), "media-type: expected")
}

// storeLayers says whether a pull of ref stores every layer it downloads:
// asked for (WithKeepLayers); the node can share them (containerd's hosts
// configuration names a mirror for ref's registry: mirrorFor); or retrying
// a pull that failed and left what it fetched, so that a third attempt
// resumes where this one is cut (a layer not stored comes again whole).
// The daemon is asked only where a layer could go unstored (direct.go).
func (r *Puller) storeLayers(ctx context.Context, s unpackStrategy, ref string) bool {
	if r.keepLayers || s.containerd || !s.parallel || !s.local {
		return true
	}
	if m, err := r.mirrorFor(ctx, ref); err != nil || m.Mirrored() {
		// A hosts configuration that cannot be read: stored, as
		// containerd's own pull would.
		return true
	}
	ls, err := r.conn.Client.LeasesService().List(ctx, "id=="+partialLeaseID(ref))
	return err == nil && len(ls) > 0
}

// mirrorFor is what containerd's hosts configuration says of ref's
// registry. A peer-to-peer mirror (Spegel) is configured there, and it
// serves its peers from each node's content store: a layer not stored is
// a layer no peer gets from this node, so where a mirror is named the
// layers are kept (what a fleet saves, and what it costs one node:
// docs/operations.md).
func (r *Puller) mirrorFor(ctx context.Context, ref string) (registry.Mirrors, error) {
	n, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return registry.Mirrors{}, fmt.Errorf("reference %s: %w", ref, err)
	}
	return r.conn.Registry.Mirrors(ctx, reference.Domain(n))
}

// LayerStorage is whether and why pulls store the layer blobs they
// extract (storeLayers), for a person to read (gpupin detect).
type LayerStorage struct {
	// Forced: WithKeepLayers (--keep-layers) stores every layer.
	Forced bool `json:"forced"`
	// Streamed: on this daemon and snapshotter gpupin extracts layers
	// itself, in parallel, so a layer can go unstored (overlayfs, as root,
	// with the host's snapshot directories); otherwise every layer is
	// stored anyway.
	Streamed bool `json:"streamed"`
	// Unpack is the unpack strategy pulls use here.
	Unpack string `json:"unpack"`
	// HostsDir is containerd's hosts directory read.
	HostsDir string `json:"hosts_dir,omitempty"`
	// Mirrored are the registries (or _default) whose hosts
	// configuration names a mirror: their layers are stored.
	Mirrored []registry.Mirrors `json:"mirrored,omitempty"`
	// Summary says it in a line.
	Summary string `json:"summary"`
}

// LayerStorage says whether and why pulls here store layer blobs.
func (r *Puller) LayerStorage(ctx context.Context) (LayerStorage, error) {
	ctx = r.conn.Ctx(ctx)
	s := r.strategy(ctx)
	ls := LayerStorage{Forced: r.keepLayers, Streamed: !s.containerd && s.parallel && s.local, Unpack: s.String(),
		HostsDir: r.conn.Registry.Config().HostsDir}
	var err error
	ls.Mirrored, err = r.conn.Registry.MirrorConfigs(ctx)
	var names []string
	for _, m := range ls.Mirrored {
		name := m.Registry
		if name == "_default" {
			name = "every registry without a directory of its own (_default)"
		}
		names = append(names, name+": "+strings.Join(m.Hosts, ", "))
	}
	switch {
	case ls.Forced:
		ls.Summary = "every layer blob is stored: --keep-layers"
	case !ls.Streamed:
		ls.Summary = "every layer blob is stored, as containerd's own pull does: the unpack here (" + ls.Unpack + ") reads layers from the content store"
	case len(names) > 0:
		ls.Summary = "layer blobs are stored for registries a mirror serves, so peers can fetch them from this node; " +
			"for any other registry they are streamed into snapshots without being stored"
	default:
		ls.Summary = "layer blobs are streamed into snapshots without being stored: no mirror in the hosts configuration, so no peer would fetch them from this node (--keep-layers stores them)"
	}
	if len(names) > 0 {
		ls.Summary += "; mirrors named: " + strings.Join(names, "; ")
	}
	return ls, err
}

// keepPartial moves what the pull's lease holds (whole blobs, partial
// downloads, unpacked snapshots) under a lease of its own that outlives
// the attempt. Without it the attempt's lease is deleted, the collector
// frees the layers, and the next attempt fetches them again; worse, it
// may find a snapshot the collector is about to remove and fail on
// "parent snapshot does not exist".
func (r *Puller) keepPartial(ctx context.Context, ref string) error {
	cur, ok := leases.FromContext(ctx)
	if !ok {
		return nil
	}
	ls := r.conn.Client.LeasesService()
	res, err := ls.ListResources(ctx, leases.Lease{ID: cur})
	if err != nil {
		return fmt.Errorf("list what the pull fetched: %w", err)
	}
	if len(res) == 0 {
		return nil
	}
	l, err := ls.Create(ctx, leases.WithID(partialLeaseID(ref)), leases.WithExpiration(partialTTL),
		leases.WithLabels(map[string]string{conn.LabelManaged: "true", conn.LabelRole: "partial", conn.LabelSource: ref}))
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
