package pull_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestPullByDigestAndRunHardened(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg, "GREETING=hello")

	var last containerd.Progress
	p, err := rt.Pull(ctx, ref, containerd.PullOptions{Progress: func(pr containerd.Progress) { last = pr }})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Created || p.Name != ref {
		t.Fatalf("pulled %+v, want a new record named %s", p, ref)
	}
	if !last.Finished || last.Done != last.Total || last.Layers == 0 {
		t.Fatalf("final progress %+v: want finished with all layers", last)
	}
	// The pull landed under a staging name and left only the real record;
	// containerd still recorded where the content came from.
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	imgs, err := rt.Client().ImageService().List(nsctx)
	if err != nil || len(imgs) != 1 || imgs[0].Name != ref {
		t.Fatalf("image records after a pull: %v, %v; want only %s", imgs, err, ref)
	}
	info, err := rt.Client().ContentStore().Info(nsctx, imgs[0].Target.Digest)
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := strings.Cut(reg.Host, ":") // containerd keys it by host name, without the port
	if src := info.Labels["containerd.io/distribution.source."+host]; src != "eng" {
		t.Errorf("distribution source label = %q (labels %v); want the real repository", src, info.Labels)
	}

	script := `echo net=$(ls /sys/class/net | tr '\n' ' '); ` +
		`if touch /rootfs-test 2>/dev/null; then echo rootfs=writable; else echo rootfs=readonly; fi; ` +
		`touch /tmp/ok && echo tmp=writable; ` +
		`grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status; echo greeting=$GREETING; cat /probe/file`
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "file"), []byte("mounted\n"), 0o644)
	res, err := rt.Run(ctx, containerd.RunSpec{
		Image: ref, Args: []string{"/bin/sh", "-c", script}, Hardened: true, Role: "probe",
		Mounts:      []containerd.Mount{{Source: filepath.Join(dir, "file"), Destination: "/probe/file"}},
		MemoryLimit: 256 << 20, PidsLimit: 64, Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Output)
	}
	out := string(res.Output)
	for _, want := range []string{"net=lo\n", "rootfs=readonly", "tmp=writable", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "NoNewPrivs:\t1", "greeting=hello", "mounted"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	ctrtest.AssertNothingLeft(t, rt)
}

// A pull that extracts here knows the snapshots' filesystem and syncs
// it (what SetPin waits for); a runtime that extracted nothing has
// nothing of its own to sync.
func TestPullThatExtractsHereSyncsItsSnapshots(t *testing.T) {
	testenv.RequireRoot(t) // extraction here needs root
	ctx := context.Background()
	reg := testenv.Registry(t)
	if gens, err := testenv.Runtime(t).Puller().SyncSnapshots(ctx); err != nil || gens != 0 {
		t.Errorf("a runtime that pulled nothing: %d syncs asked, %v; want none", gens, err)
	}
	rt := testenv.Runtime(t)
	// Layers of the test's own: a blob already in the store is applied by
	// the daemon, never extracted here.
	ref := ctrtest.PushImage(t, reg, "synced:1", sandbox.ImageSpec{Layers: whiteoutLayers(t, compression.GZip, t.Name()+time.Now().String())})
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	gens, err := rt.Puller().SyncSnapshots(ctx)
	if err != nil || gens == 0 {
		t.Errorf("sync of the snapshots' filesystem after a pull: %v after %d syncs asked; want one at least", err, gens)
	}
}

// A pull of a digest whose pinned record lost content refetches without
// touching the record: containerd's own Pull would replace its labels.
func TestPullNeverRewritesAnExistingRecord(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	layer, err := sandbox.RandomLayer(32 << 10)
	if err != nil {
		t.Fatal(err)
	}
	ref := ctrtest.PushImage(t, reg, "eng:own", sandbox.ImageSpec{Layers: []v1.Layer{layer}})
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	pin := containerd.Pin{Key: "eng:own", Ref: ref, Variant: "cu129", Source: reg.Host + "/eng:own", Override: "auto", Node: "sha256-x", ProbedAt: time.Now().Truncate(time.Second)}
	if err := rt.SetPin(ctx, pin, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	// The layer's content goes (where it was stored: a layer extracted
	// here is not), and with it the unpacked snapshots.
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	ld, _ := layer.Digest()
	cs := rt.Client().ContentStore()
	if err := cs.Delete(nsctx, digest.Digest(ld.String())); err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	sn := rt.Client().SnapshotService("overlayfs")
	var keys []string
	sn.Walk(nsctx, func(_ context.Context, info snapshotInfo) error { keys = append(keys, info.Name); return nil })
	for i := len(keys) - 1; i >= 0; i-- {
		sn.Remove(nsctx, keys[i])
	}
	p, err := rt.Pull(ctx, ref, containerd.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Created {
		t.Error("the pull claims to have created a record that existed")
	}
	got, err := rt.GetPin(ctx, "eng:own")
	if err != nil || got == nil || got.Ref != ref || got.Node != "sha256-x" {
		t.Fatalf("the pin's record was rewritten: %+v, %v", got, err)
	}
	rec, err := rt.Client().ImageService().Get(nsctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := client.NewImage(rt.Client(), rec).IsUnpacked(nsctx, "overlayfs"); err != nil || !ok {
		t.Fatalf("the layer was not fetched and unpacked again: %v, %v", ok, err)
	}
	// No staging record is left.
	imgs, _ := rt.Client().ImageService().List(nsctx)
	for _, i := range imgs {
		if strings.Contains(i.Name, "#gpupin-staging-") {
			t.Errorf("staging record left: %s", i.Name)
		}
	}
}
