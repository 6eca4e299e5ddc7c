package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

// partialLeaseID names the lease that keeps what failed pulls of ref fetched.
func partialLeaseID(ref string) string {
	h := sha256.Sum256([]byte(ref))
	return "gpupin-partial-" + hex.EncodeToString(h[:8])
}

// worthKeeping tells a pull that may succeed on retry (the registry or the
// network failed) from one that will not: content that lies about its
// digest or size, or a full disk, whose partial data only takes space.
func worthKeeping(err error) bool {
	if errdefs.IsFailedPrecondition(err) || errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || errors.Is(err, errWrongDiffID) {
		return false
	}
	if strings.Contains(err.Error(), "media-type: expected") {
		// containerd found a manifest whose body is not of the type the
		// registry said: the same bytes will fail the same way.
		return false
	}
	return !strings.Contains(err.Error(), "no space left on device")
}

// storeLayers says whether a pull of ref stores every layer it downloads:
// asked for (WithKeepLayers), or retrying a pull that failed and left what
// it fetched, so that a third attempt resumes where this one is cut (a
// layer not stored comes again whole). The daemon is asked only where a
// layer could go unstored (direct.go).
func (r *Runtime) storeLayers(ctx context.Context, s unpackStrategy, ref string) bool {
	if r.keepLayers || s.containerd || !s.parallel || !s.local {
		return true
	}
	ls, err := r.client.LeasesService().List(ctx, "id=="+partialLeaseID(ref))
	return err == nil && len(ls) > 0
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
