package pins

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/containerd/conn"
)

// Swept counts what a sweep removed.
type Swept struct {
	Containers int `json:"containers"`
	Leases     int `json:"leases"`
	Candidates int `json:"candidates"`
}

// Sweep removes what an interrupted gpupin left: probe containers (with
// their tasks and snapshots), leases and candidate image records whose
// owning process is gone, and what failed pulls kept for a retry (the
// gpupin-partial leases). What a live gpupin is working on is left alone.
// `gpupin gc` and the loop's start run it.
func (r *Store) Sweep(ctx context.Context) (Swept, error) {
	return r.sweep(ctx, false)
}

// SweepOrphans is Sweep without the partial leases: what a failed pull set
// aside so its retry resumes stays until the retry, or its hour, is up.
// When nothing is left it is three label-filtered listings and a read of
// /proc per owner, so it is cheap to run every few seconds: the agent runs
// it on a timer, so a probe orphaned after the loop's start is stopped.
func (r *Store) SweepOrphans(ctx context.Context) (Swept, error) {
	return r.sweep(ctx, true)
}

func (r *Store) sweep(ctx context.Context, keepPartial bool) (Swept, error) {
	ctx = r.conn.Ctx(ctx)
	var s Swept
	// Probe containers, by the part that runs them (run.Runner.SweepProbes).
	var err error
	if s.Containers, err = r.sweepProbes(ctx); err != nil {
		return s, fmt.Errorf("sweep: %w", err)
	}

	is := r.conn.Client.ImageService()
	imgs, err := is.List(ctx, fmt.Sprintf(`labels.%q==candidate`, conn.LabelRole))
	if err != nil {
		return s, fmt.Errorf("sweep: list candidates: %w", err)
	}
	for _, img := range imgs {
		if img.Labels[LabelPin] != "" || img.Labels[LabelPrevious] != "" || conn.OwnerAlive(img.Labels[conn.LabelOwner]) {
			continue
		}
		if err := is.Delete(ctx, img.Name); err != nil && !errdefs.IsNotFound(err) {
			return s, fmt.Errorf("sweep: candidate %s: %w", img.Name, err)
		}
		s.Candidates++
	}

	ls := r.conn.Client.LeasesService()
	all, err := ls.List(ctx, fmt.Sprintf(`labels.%q`, conn.LabelManaged))
	if err != nil {
		return s, fmt.Errorf("sweep: list leases: %w", err)
	}
	for _, l := range all {
		if keepPartial && l.Labels[conn.LabelRole] == "partial" {
			continue
		}
		if conn.OwnerAlive(l.Labels[conn.LabelOwner]) {
			continue
		}
		// Synchronous: what the lease held (partial downloads, extraction
		// snapshots) is collected before gc says it is done.
		if err := ls.Delete(ctx, leases.Lease{ID: l.ID}, leases.SynchronousDelete); err != nil && !errdefs.IsNotFound(err) {
			return s, fmt.Errorf("sweep: lease %s: %w", l.ID, err)
		}
		s.Leases++
	}
	return s, nil
}
