package run

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/containerd/conn"
)

// SweepProbes stops and removes the probe containers (with their tasks and
// snapshots) whose owning process is gone: the first step of the pin
// store's Sweep, which hands it here as the part that runs containers. It
// says how many it removed.
func (r *Runner) SweepProbes(ctx context.Context) (int, error) {
	ctx = r.conn.Ctx(ctx)
	n := 0
	// Probes only: a replica (gpupin run) is not gpupin's to stop.
	conts, err := r.conn.Client.Containers(ctx, fmt.Sprintf(`labels.%q==probe`, conn.LabelRole))
	if err != nil {
		return n, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range conts {
		// The listing carries the records: no call per container.
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil || info.Labels[conn.LabelManaged] == "" || info.Labels[conn.LabelRole] != "probe" {
			continue
		}
		// A probe lives minutes; one a day old from another pid namespace
		// has no one waiting on it.
		if o := info.Labels[conn.LabelOwner]; conn.OwnerAlive(o) && !conn.StaleForeign(o, info.CreatedAt) {
			continue
		}
		if task, err := c.Task(ctx, nil); err == nil {
			if ch, err := task.Wait(ctx); err == nil {
				killTask(ctx, task, ch)
			} else {
				killLost(ctx, task)
			}
			if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				return n, fmt.Errorf("task of %s: %w", c.ID(), err)
			}
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			return n, fmt.Errorf("container %s: %w", c.ID(), err)
		}
		n++
	}
	return n, nil
}
