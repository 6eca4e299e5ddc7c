package containerd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// pushed publishes a one-variant engine and returns the child's digest ref.
func pushed(t *testing.T, reg *sandbox.Registry, env ...string) string {
	t.Helper()
	return pushImage(t, reg, "eng:1", sandbox.ImageSpec{Env: env})
}

// pushImage pushes the image spec makes as reg/repoTag and returns its
// reference by digest.
func pushImage(t *testing.T, reg *sandbox.Registry, repoTag string, spec sandbox.ImageSpec) string {
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

func TestPullByDigestAndRunHardened(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := pushed(t, reg, "GREETING=hello")

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
	nsctx := withNS(ctx, rt.Namespace())
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
	assertNothingLeft(t, rt)
}

func TestRunTimeoutLeavesNothing(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", "echo started; sleep 600"}, Hardened: true, Role: "probe", Timeout: time.Second})
	if !errors.Is(err, containerd.ErrTimeout) || !res.TimedOut {
		t.Fatalf("err = %v, timed out %v; want a timeout", err, res.TimedOut)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("timeout took %s", time.Since(start))
	}
	if !strings.Contains(string(res.Output), "started") {
		t.Errorf("output before the kill is lost: %q", res.Output)
	}
	assertNothingLeft(t, rt)
}

// A pull that extracts here knows the snapshots' filesystem and syncs
// it (what SetPin waits for); a runtime that extracted nothing has
// nothing of its own to sync.
func TestPullThatExtractsHereSyncsItsSnapshots(t *testing.T) {
	testenv.RequireRoot(t) // extraction here needs root
	ctx := context.Background()
	reg := testenv.Registry(t)
	if gens, err := testenv.Runtime(t).SyncSnapshots(ctx); err != nil || gens != 0 {
		t.Errorf("a runtime that pulled nothing: %d syncs asked, %v; want none", gens, err)
	}
	rt := testenv.Runtime(t)
	// Layers of the test's own: a blob already in the store is applied by
	// the daemon, never extracted here.
	ref := pushImage(t, reg, "synced:1", sandbox.ImageSpec{Layers: whiteoutLayers(t, compression.GZip, t.Name()+time.Now().String())})
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	gens, err := rt.SyncSnapshots(ctx)
	if err != nil || gens == 0 {
		t.Errorf("sync of the snapshots' filesystem after a pull: %v after %d syncs asked; want one at least", err, gens)
	}
}

func TestRunOutputIsCapped(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", OutputLimit: 4096, Timeout: 30 * time.Second,
		Args: []string{"/bin/sh", "-c", "dd if=/dev/zero bs=1024 count=2048 2>/dev/null | tr '\\0' x; echo; echo LAST-LINE"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output) > 4096 || !res.Truncated || !strings.HasSuffix(strings.TrimSpace(string(res.Output)), "LAST-LINE") {
		t.Fatalf("kept %d bytes, truncated %v, tail %q", len(res.Output), res.Truncated, tail(res.Output))
	}
}

func TestCDIInjectionSeenInside(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	specDir := t.TempDir()
	spec := `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      deviceNodes:
        - path: /dev/gpupin-test0
          hostPath: /dev/null
      env:
        - GPUPIN_CDI_TEST=injected
`
	os.WriteFile(filepath.Join(specDir, "nvidia.yaml"), []byte(spec), 0o644)
	rt := testenv.Runtime(t, containerd.WithCDISpecDirs(specDir))
	ref := pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", Hardened: true, Timeout: 30 * time.Second,
		GPUs: containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{containerd.DefaultCDIDevice}},
		Args: []string{"/bin/sh", "-c", "echo env=$GPUPIN_CDI_TEST; ls /dev/gpupin-test0"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	if out := string(res.Output); !strings.Contains(out, "env=injected") || !strings.Contains(out, "/dev/gpupin-test0") {
		t.Fatalf("CDI edits not seen inside:\n%s", out)
	}

	// A device no spec describes is refused with the command that makes one.
	_, err = rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", GPUs: containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"nvidia.com/gpu=7"}}, Args: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "nvidia-ctk cdi generate") {
		t.Fatalf("err = %v, want one naming nvidia-ctk cdi generate", err)
	}
	assertNothingLeft(t, rt)
}

func assertNothingLeft(t *testing.T, rt *containerd.Runtime) {
	t.Helper()
	ctx := context.Background()
	c := rt.Client()
	nsCtx := withNS(ctx, rt.Namespace())
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
	c.SnapshotService("overlayfs").Walk(nsCtx, func(_ context.Context, info snapshotInfo) error {
		if info.Kind != snapshotCommitted {
			snaps = append(snaps, fmt.Sprintf("%s(%v)", info.Name, info.Kind))
		}
		return nil
	})
	if len(snaps) != 0 {
		t.Errorf("active snapshots left: %v", snaps)
	}
}

func tail(b []byte) string {
	if len(b) > 80 {
		b = b[len(b)-80:]
	}
	return string(b)
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
	ref := pushImage(t, reg, "eng:own", sandbox.ImageSpec{Layers: []v1.Layer{layer}})
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	pin := containerd.Pin{Key: "eng:own", Ref: ref, Variant: "cu129", Source: reg.Host + "/eng:own", Override: "auto", Node: "sha256-x", ProbedAt: time.Now().Truncate(time.Second)}
	if err := rt.SetPin(ctx, pin, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	// The layer's content goes (where it was stored: a layer extracted
	// here is not), and with it the unpacked snapshots.
	nsctx := withNS(ctx, rt.Namespace())
	ld, _ := layer.Digest()
	cs := rt.Client().ContentStore()
	if err := cs.Delete(nsctx, digestOf(ld.String())); err != nil && !errdefs.IsNotFound(err) {
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

// gc deletes the records gpupin made, and only lets go of one it adopted
// (pulled by someone else, then proved and pinned by gpupin).
func TestGCLetsGoOfAdoptedRecords(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := pushed(t, reg, "ADOPTED=1")
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	nsctx := withNS(ctx, rt.Namespace())
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

// deadOwner is the owner label of a process that has exited.
func deadOwner(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	owner := containerd.OwnerOf(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	return owner
}

func TestParseGPUs(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		devices []string
		want    containerd.GPUs
		wantErr bool
	}{
		{"", nil, containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{containerd.DefaultCDIDevice}}, false},
		{"cdi", []string{"0,1", "GPU-abc", " "}, containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-abc"}}, false},
		{"cdi", []string{"vendor.com/dev=x", "all"}, containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"vendor.com/dev=x", "nvidia.com/gpu=all"}}, false},
		{"nvidia-runtime", []string{"0,1"}, containerd.GPUs{Mode: containerd.GPUNvidiaRuntime, Devices: []string{"0,1"}}, false},
		{"none", []string{"0"}, containerd.GPUs{Mode: containerd.GPUNone}, false},
		{"CDI", nil, containerd.GPUs{}, true},
		{"docker", nil, containerd.GPUs{}, true},
	} {
		got, err := containerd.ParseGPUs(tc.mode, tc.devices)
		if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseGPUs(%q, %q) = %+v, %v; want %+v (error %v)", tc.mode, tc.devices, got, err, tc.want, tc.wantErr)
		}
	}
}
