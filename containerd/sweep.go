package containerd

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
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
func (r *Runtime) Sweep(ctx context.Context) (Swept, error) {
	return r.sweep(ctx, false)
}

// SweepOrphans is Sweep without the partial leases: what a failed pull set
// aside so its retry resumes stays until the retry, or its hour, is up.
// When nothing is left it is three label-filtered listings and a read of
// /proc per owner, so it is cheap to run every few seconds: the agent runs
// it on a timer, so a probe orphaned after the loop's start is stopped.
func (r *Runtime) SweepOrphans(ctx context.Context) (Swept, error) {
	return r.sweep(ctx, true)
}

func (r *Runtime) sweep(ctx context.Context, keepPartial bool) (Swept, error) {
	ctx = r.ctx(ctx)
	var s Swept
	// Probes only: a replica (gpupin run) is not gpupin's to stop.
	conts, err := r.client.Containers(ctx, fmt.Sprintf(`labels.%q==probe`, LabelRole))
	if err != nil {
		return s, fmt.Errorf("sweep: list containers: %w", err)
	}
	for _, c := range conts {
		// The listing carries the records: no call per container.
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil || info.Labels[LabelManaged] == "" || info.Labels[LabelRole] != "probe" {
			continue
		}
		// A probe lives minutes; one a day old from another pid namespace
		// has no one waiting on it.
		if o := info.Labels[LabelOwner]; ownerAlive(o) && !staleForeign(o, info.CreatedAt) {
			continue
		}
		if task, err := c.Task(ctx, nil); err == nil {
			if ch, err := task.Wait(ctx); err == nil {
				killTask(ctx, task, ch)
			} else {
				killLost(ctx, task)
			}
			if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				return s, fmt.Errorf("sweep: task of %s: %w", c.ID(), err)
			}
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			return s, fmt.Errorf("sweep: container %s: %w", c.ID(), err)
		}
		s.Containers++
	}

	is := r.client.ImageService()
	imgs, err := is.List(ctx, fmt.Sprintf(`labels.%q==candidate`, LabelRole))
	if err != nil {
		return s, fmt.Errorf("sweep: list candidates: %w", err)
	}
	for _, img := range imgs {
		if img.Labels[LabelPin] != "" || img.Labels[LabelPrevious] != "" || ownerAlive(img.Labels[LabelOwner]) {
			continue
		}
		if err := is.Delete(ctx, img.Name); err != nil && !errdefs.IsNotFound(err) {
			return s, fmt.Errorf("sweep: candidate %s: %w", img.Name, err)
		}
		s.Candidates++
	}

	ls := r.client.LeasesService()
	all, err := ls.List(ctx, fmt.Sprintf(`labels.%q`, LabelManaged))
	if err != nil {
		return s, fmt.Errorf("sweep: list leases: %w", err)
	}
	for _, l := range all {
		if keepPartial && l.Labels[LabelRole] == "partial" {
			continue
		}
		if ownerAlive(l.Labels[LabelOwner]) {
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
