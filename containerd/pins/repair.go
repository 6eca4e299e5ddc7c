package pins

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd/conn"
)

// The repairs: what carries out the decisions of decide.go on the pins,
// their proofs and leases (the local names' own are in local.go). Each
// acts on containerd and says what it did.

// restore puts the record a proof names back as the key's pin: its labels
// on a record that lost them, or the record itself, from the content that
// the pin's lease kept. It returns nil and why, when the proof must not or
// cannot be restored.
func (r *Store) restore(ctx context.Context, key string, p proof) (*images.Image, action, string, error) {
	is := r.conn.Client.ImageService()
	labels := p.restoredLabels(time.Now())
	for range 2 {
		rec, err := is.Get(ctx, p.Ref)
		if err == nil {
			if why := whyNotRestore(key, p, rec); why != "" {
				return nil, 0, why, nil
			}
			rec.Labels = labels
			updated, err := is.Update(ctx, rec, labelPaths(append(pinLabelKeys, conn.LabelCreated))...)
			if err != nil {
				return nil, 0, "", err
			}
			return &updated, actRelabelled, "a pull by another client had replaced its labels", nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, 0, "", err
		}
		target := p.target()
		if _, err := r.conn.Client.ContentStore().Info(ctx, target.Digest); errdefs.IsNotFound(err) {
			return nil, 0, "its record and content are gone: it is proved again", nil
		} else if err != nil {
			return nil, 0, "", err
		}
		img := client.NewImageWithPlatform(r.conn.Client, images.Image{Name: p.Ref, Target: target}, platforms.Default())
		if ok, err := img.IsUnpacked(ctx, r.conn.Snapshotter); err != nil || !ok {
			if err := img.Unpack(ctx, r.conn.Snapshotter); err != nil {
				return nil, 0, fmt.Sprintf("its record is gone and its content incomplete (%v): it is proved again", err), nil
			}
		}
		// Made by gpupin now, whoever made the record that went.
		labels[conn.LabelCreated] = "true"
		created, err := is.Create(ctx, images.Image{Name: p.Ref, Target: target, Labels: labels})
		if errdefs.IsAlreadyExists(err) {
			continue // made meanwhile (a pull): judged as a record that is there
		}
		if err != nil {
			return nil, 0, "", err
		}
		return &created, actRecreated, "its record had been deleted (kubelet's image GC, crictl rmi); its content remained", nil
	}
	return nil, 0, "", fmt.Errorf("%s keeps appearing and going", p.Ref)
}

// keepProof carries out plan for cur, the key's pin: writes cur's proof
// on its manifest, holds that in the key's lease, and drops every other
// proof of the key.
func (r *Store) keepProof(ctx context.Context, key string, cur images.Image, plan proofPlan) ([]Recovered, error) {
	var out []Recovered
	if plan.write {
		v, err := proofOf(cur).encode(key)
		if err != nil {
			return out, err
		}
		info := content.Info{Digest: cur.Target.Digest, Labels: map[string]string{proofLabel(key): v}}
		if _, err := r.conn.Client.ContentStore().Update(ctx, info, "labels."+proofLabel(key)); err != nil {
			return out, fmt.Errorf("pin %s: write its proof on %s: %w", key, cur.Target.Digest, err)
		}
		if plan.report {
			out = append(out, actProof.report(key, cur.Name, ""))
		}
	}
	ls := r.conn.Client.LeasesService()
	l := leases.Lease{ID: pinLeaseID(key)}
	if plan.lease {
		var err error
		l, err = ls.Create(ctx, leases.WithID(l.ID), leases.WithLabels(map[string]string{conn.LabelRole: PinLeaseRole, LabelPin: key}))
		if err != nil && !errdefs.IsAlreadyExists(err) {
			return out, fmt.Errorf("pin %s: lease for its content: %w", key, err)
		}
		l.ID = pinLeaseID(key)
	}
	if err := ls.AddResource(ctx, l, leases.Resource{ID: cur.Target.Digest.String(), Type: "content"}); err != nil && !errdefs.IsAlreadyExists(err) {
		return out, fmt.Errorf("pin %s: hold its content: %w", key, err)
	}
	for _, on := range plan.drop {
		if err := r.dropProof(ctx, key, l, on); err != nil {
			return out, err
		}
	}
	return out, nil
}

// dropProof clears the key's proof from a manifest and lets the lease go
// of it; the manifest stays for whatever else holds it.
func (r *Store) dropProof(ctx context.Context, key string, l leases.Lease, on digest.Digest) error {
	info := content.Info{Digest: on, Labels: map[string]string{}}
	if _, err := r.conn.Client.ContentStore().Update(ctx, info, "labels."+proofLabel(key)); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("pin %s: clear its proof on %s: %w", key, on, err)
	}
	err := r.conn.Client.LeasesService().DeleteResource(ctx, l, leases.Resource{ID: on.String(), Type: "content"})
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("pin %s: let go of %s: %w", key, on, err)
	}
	return nil
}

// clearKey removes what a key without a pin still has: its proofs, its
// lease, and its local names as steps (planClearLocal) say. A step that
// fails does not stop the others.
func (r *Store) clearKey(ctx context.Context, key string, s *keyState, steps []localStep) ([]Recovered, error) {
	errs := []error{r.clearProofs(ctx, key, s)}
	var out []Recovered
	for _, st := range steps {
		done, err := r.applyLocal(ctx, st)
		if err != nil {
			errs = append(errs, fmt.Errorf("pin %s: %w", key, err))
			continue
		}
		out = append(out, done)
	}
	if len(out) == 0 && (s.lease || len(s.proofs) > 0) {
		out = append(out, actCleared.report(key, "", "no pin: its proof and lease are removed"))
	}
	return out, errors.Join(errs...)
}

// clearProofs drops every proof of the key and deletes its lease: the
// first step of an unpin, so that nothing can restore what it takes.
func (r *Store) clearProofs(ctx context.Context, key string, s *keyState) error {
	l := leases.Lease{ID: pinLeaseID(key)}
	for _, sp := range s.proofs {
		if err := r.dropProof(ctx, key, l, sp.on); err != nil {
			return err
		}
	}
	if !s.lease {
		return nil
	}
	if err := r.conn.Client.LeasesService().Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("pin %s: delete the lease of its content: %w", key, err)
	}
	return nil
}
