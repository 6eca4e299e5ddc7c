package pins_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/testenv"
)

// gc deletes the records gpupin made, and only lets go of one it adopted
// (pulled by someone else, then proved and pinned by gpupin).
func TestGCLetsGoOfAdoptedRecords(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg, "ADOPTED=1")
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	is := rt.Client().ImageService()
	rec, _ := is.Get(nsctx, ref)
	// As if kubelet had pulled it: the same target under another name, no labels.
	adopted := reg.Host + "/other@" + rec.Target.Digest.String()
	rec.Name, rec.Labels = adopted, nil
	if _, err := is.Create(nsctx, rec); err != nil {
		t.Fatal(err)
	}
	for _, p := range []containerd.Pin{
		{Key: "a:1", Ref: ref, Node: "x", ProbedAt: time.Now()},
		{Key: "b:1", Ref: adopted, Node: "x", ProbedAt: time.Now()},
	} {
		if err := rt.SetPin(ctx, p, containerd.SetPinOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Unpin(ctx, p.Key); err != nil {
			t.Fatal(err)
		}
	}
	// What a gpupin that died left: gc sweeps it first, as `gpupin gc` does.
	leftover, err := rt.Client().LeasesService().Create(nsctx, leases.WithRandomID(),
		leases.WithLabels(map[string]string{containerd.LabelManaged: "true", containerd.LabelOwner: deadOwner(t)}))
	if err != nil {
		t.Fatal(err)
	}
	col, err := rt.GC(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(col.Removed) != 1 || col.Removed[0] != ref || len(col.Released) != 1 || col.Released[0] != adopted {
		t.Fatalf("gc = %+v; want %s removed and %s released", col, ref, adopted)
	}
	if col.Swept.Leases != 1 {
		t.Errorf("gc swept %+v; want the dead owner's lease", col.Swept)
	}
	if ls, err := rt.Client().LeasesService().List(nsctx, "id=="+leftover.ID); err != nil || len(ls) != 0 {
		t.Errorf("the dead owner's lease is still there: %v %v", ls, err)
	}
	got, err := is.Get(nsctx, adopted)
	if err != nil {
		t.Fatalf("the adopted record is gone: %v", err)
	}
	for k := range got.Labels {
		if strings.HasPrefix(k, "io.gpupin.") || k == containerd.LabelCRIPinned {
			t.Errorf("label %s left on the released record", k)
		}
	}
}
