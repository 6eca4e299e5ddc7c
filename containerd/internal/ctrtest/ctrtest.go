// Package ctrtest holds what the daemon tests of containerd's packages
// (pull, pins, run) share: images pushed to the test registry, and the check
// that a run left nothing behind.
package ctrtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
)

// Pushed publishes a one-variant engine and returns the child's digest ref.
func Pushed(t *testing.T, reg *sandbox.Registry, env ...string) string {
	t.Helper()
	return PushImage(t, reg, "eng:1", sandbox.ImageSpec{Env: env})
}

// PushImage pushes the image spec makes as reg/repoTag and returns its
// reference by digest.
func PushImage(t *testing.T, reg *sandbox.Registry, repoTag string, spec sandbox.ImageSpec) string {
	t.Helper()
	img, err := sandbox.Image(spec)
	if err != nil {
		t.Fatal(err)
	}
	d, err := sandbox.PushImage(context.Background(), reg.Host+"/"+repoTag, img)
	if err != nil {
		t.Fatal(err)
	}
	repo, _, _ := strings.Cut(repoTag, ":")
	return reg.Host + "/" + repo + "@" + d.String()
}

// AssertNothingLeft fails t if rt's namespace holds a container, a task
// or an active snapshot: a run removes all three, whatever happens.
func AssertNothingLeft(t *testing.T, rt *containerd.Runtime) {
	t.Helper()
	ctx := context.Background()
	c := rt.Client()
	nsCtx := namespaces.WithNamespace(ctx, rt.Namespace())
	conts, err := c.Containers(nsCtx)
	if err != nil {
		t.Fatal(err)
	}
	if len(conts) != 0 {
		t.Errorf("%d containers left", len(conts))
	}
	tasks, err := c.TaskService().List(nsCtx, nil)
	if err == nil && len(tasks.Tasks) != 0 {
		t.Errorf("%d tasks left", len(tasks.Tasks))
	}
	var snaps []string
	c.SnapshotService("overlayfs").Walk(nsCtx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind != snapshots.KindCommitted {
			snaps = append(snaps, fmt.Sprintf("%s(%v)", info.Name, info.Kind))
		}
		return nil
	})
	if len(snaps) != 0 {
		t.Errorf("active snapshots left: %v", snaps)
	}
}
