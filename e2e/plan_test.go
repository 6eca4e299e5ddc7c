package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// Plan reads only. A pin record another client deleted (kubelet's image
// GC on containerd 1.6) stays deleted through a plan, which then answers
// from the registry; the next Pins (what provision, `gpupin pins` and the
// agent read) restores it, and the plan answers from the pin again.
func TestPlanSimulatedReadsPinsWithoutRestoring(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ctx := context.Background()
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{testenv.CU13, testenv.CU129}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := testenv.Provisioner(t, rt, provision.WithNode(testenv.NewNode(testenv.H100("575.57.08", "12.9"))),
		provision.WithOverrides(provision.NoOverrides()), provision.WithLockDir(filepath.Join(dir, "locks")),
		provision.WithProbeTimeout(30*time.Second), provision.WithProbeDir(filepath.Join(dir, "probe")))
	want := provision.Want{Engine: "demo", Version: "1.0", Ref: reg.Host + "/demo:1.0"}
	st := p.Provision(ctx, want)
	if st.State != provision.Ready {
		t.Fatalf("provision: %v", st)
	}
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	is := rt.Client().ImageService()
	if err := is.Delete(nsctx, st.Pinned, images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}

	pl, err := p.Plan(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := is.Get(nsctx, st.Pinned); !errdefs.IsNotFound(err) {
		t.Fatalf("plan restored the deleted pin record %s (get: %v): it must only read", st.Pinned, err)
	}
	if pl.Outcome == provision.OutcomePinned || len(pl.Candidates) == 0 {
		t.Fatalf("plan with the pin record gone: outcome %s, %d candidates; want the registry's candidates", pl.Outcome, len(pl.Candidates))
	}

	if _, err := rt.Pins(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := is.Get(nsctx, st.Pinned); err != nil {
		t.Fatalf("Pins did not restore %s: %v", st.Pinned, err)
	}
	if pl, err = p.Plan(ctx, want); err != nil || pl.Outcome != provision.OutcomePinned || pl.Pinned.Ref != st.Pinned {
		t.Fatalf("plan after the restore: %+v, %v; want it answered from %s", pl, err, st.Pinned)
	}
}
