package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// criEnv is a containerd of the test's own with its CRI plugin on, as
// kubelet sees it, and gpupin in the CRI plugin's namespace, k8s.io.
type criEnv struct {
	t   *testing.T
	d   *sandbox.Containerd
	rt  *containerd.Runtime
	reg *sandbox.Registry
	dir string
}

// newCRIEnv starts it with pause, a name no registry need serve, as the CRI
// plugin's sandbox image: an image of the test's own is put under it.
func newCRIEnv(t *testing.T, pause string) *criEnv {
	t.Helper()
	e := &criEnv{t: t, reg: testenv.Registry(t), dir: t.TempDir()}
	// The CRI plugin's own pulls (crictl pull) reach the loopback
	// registry over plain HTTP through certs.d, as a node's mirrors would.
	certsD := filepath.Join(e.dir, "certs.d")
	os.MkdirAll(filepath.Join(certsD, e.reg.Host), 0o755)
	hosts := fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+e.reg.Host, "http://"+e.reg.Host)
	if err := os.WriteFile(filepath.Join(certsD, e.reg.Host, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	// The pause image, put in place below, is never pulled.
	e.d, _ = testenv.OwnContainerd(t, sandbox.ContainerdOptions{CRI: true, RegistryConfigPath: certsD, SandboxImage: pause})
	cdi := filepath.Join(e.dir, "cdi")
	os.MkdirAll(cdi, 0o755)
	var err error
	e.rt, err = containerd.Connect(context.Background(), e.d.Address, containerd.WithNamespace("k8s.io"),
		containerd.WithRuncRoot(e.d.RuncRoot), containerd.WithFIFODir(filepath.Join(e.d.Dir, "fifo")), containerd.WithCDISpecDirs(cdi))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.rt.Close() })

	img, err := sandbox.Image(sandbox.ImageSpec{Entrypoint: []string{"sleep", "3600"}})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := sandbox.PushImage(context.Background(), e.reg.Host+"/pause:1", img)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := e.rt.Pull(context.Background(), e.reg.Host+"/pause@"+pd.String(), containerd.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	is := e.rt.Client().ImageService()
	rec, err := is.Get(e.ctx(), pulled.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := is.Create(e.ctx(), images.Image{Name: pause, Target: rec.Target}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *criEnv) ctx() context.Context {
	return namespaces.WithNamespace(context.Background(), "k8s.io")
}

// crictl runs crictl on the daemon's CRI endpoint; an error carries stderr.
func (e *criEnv) crictl(args ...string) (string, error) {
	e.t.Helper()
	ep := e.d.CRIEndpoint()
	cmd := exec.Command(testenv.Crictl(e.t), append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "30s"}, args...)...)
	cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE=/dev/null") // no host config adds to the flags
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), err
}

func (e *criEnv) must(args ...string) string {
	e.t.Helper()
	out, err := e.crictl(args...)
	if err != nil {
		e.t.Fatalf("%v\n%s", err, e.d.LogTail())
	}
	return out
}

// inspecti is crictl inspecti's status: whether CRI knows the image and
// says it is pinned.
func (e *criEnv) inspecti(name string) (found, pinned bool, raw string) {
	e.t.Helper()
	out, err := e.crictl("inspecti", "-o", "json", name)
	if err != nil {
		return false, false, err.Error()
	}
	var v struct {
		Status struct {
			Pinned   bool     `json:"pinned"`
			RepoTags []string `json:"repoTags"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		e.t.Fatalf("crictl inspecti %s: %v\n%s", name, err, out)
	}
	return true, v.Status.Pinned, out
}

func (e *criEnv) writeJSON(name, text string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// The whole path kubelet takes, through containerd's own CRI plugin and
// crictl, on both daemons: a proved engine gets gpupin.local/ENGINE:VERSION,
// which CRI reports (pinned on 2.x); an engine with no proof has no such
// image, so a pod with imagePullPolicy: Never fails (kubelet's
// ErrImageNeverPull); crictl pull of the pinned reference and crictl rmi
// --prune lose nothing the next provision needs: it answers from the pin
// with no registry request; and a host-network pod's container started
// from the local name runs the proved variant.
func TestCRISimulatedLocalNameThroughCrictl(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	e := newCRIEnv(t, sandbox.DefaultSandboxImage)
	ctx := context.Background()
	if _, err := sandbox.PublishEngine(ctx, e.reg.Host, "demo", "1.0", []sandbox.EngineVariant{testenv.CU13, testenv.CU129}); err != nil {
		t.Fatal(err)
	}
	// Driver 575 supports CUDA 12.9: cu13 is rejected, cu129 is proved.
	p := testenv.Provisioner(t, e.rt, provision.WithNode(testenv.NewNode(testenv.H100("575.57.08", "12.9"))),
		provision.WithOverrides(provision.NoOverrides()), provision.WithLockDir(filepath.Join(e.dir, "locks")),
		provision.WithProbeTimeout(30*time.Second), provision.WithProbeDir(filepath.Join(e.dir, "probe")))
	want := provision.Want{Engine: "demo", Version: "1.0", Ref: e.reg.Host + "/demo:1.0"}
	// Nothing gpupin labelled pinned yet: judged from the version.
	if c, err := e.rt.CRIPinning(ctx); err != nil || c.How != containerd.CRIJudged || c.Kept != containerd.CRIPinningOf(e.d.Version).Kept ||
		!strings.Contains(c.Why, "no image record") {
		t.Fatalf("CRIPinning before any pin = %+v, %v; want judged from the version, for want of a record", c, err)
	}
	st := p.Provision(ctx, want)
	if st.State != provision.Ready || st.Variant != "cu129" {
		t.Fatalf("provision: %v", st)
	}
	pin, err := e.rt.GetPin(ctx, "demo:1.0")
	if err != nil || pin == nil || pin.Ref != st.Pinned || pin.Local != "gpupin.local/demo:1.0" {
		t.Fatalf("pin %+v, %v: want %s with its local name", pin, err, st.Pinned)
	}
	local := pin.Local

	// Measured (docs/operations.md): 1.6.20 does not report pins as
	// pinned; 1.7.35, 2.1.9 and 2.4.2 do.
	kept := e.d.Major >= 2 || strings.HasPrefix(e.d.Version, "1.7.")
	found, pinned, raw := e.inspecti(local)
	t.Logf("containerd %s: crictl inspecti %s: found %v, pinned %v", e.d.Version, local, found, pinned)
	switch {
	case !found:
		t.Fatalf("CRI does not know %s: %s", local, raw)
	case kept && !pinned:
		t.Fatalf("containerd %s's CRI does not report %s pinned:\n%s", e.d.Version, local, raw)
	case !kept && pinned:
		t.Logf("containerd %s's CRI reports pinned images now: update docs/operations.md", e.d.Version)
	}
	if out := e.must("images"); !strings.Contains(out, "gpupin.local/demo") {
		t.Fatalf("crictl images lacks the local name:\n%s", out)
	}
	if got := containerd.CRIPinningOf(e.d.Version); got.Kept != kept || got.How != containerd.CRIJudged {
		t.Errorf("CRIPinningOf(%s) = %+v", e.d.Version, got)
	}
	// Seen, not judged: the CRI plugin is asked about the local name, and
	// says what crictl says. Debian's 1.6.20 reports it not pinned; 2.4.2
	// pinned.
	cri, err := e.rt.CRIPinning(ctx)
	t.Logf("containerd %s: CRIPinning %+v", e.d.Version, cri)
	if err != nil || cri.How != containerd.CRISeen || cri.Image != local || cri.Kept != pinned || cri.Version != e.d.Version {
		t.Fatalf("CRIPinning = %+v, %v; want seen on %s, pinned %v as crictl says", cri, err, local, pinned)
	}
	if cri.Kept != kept {
		t.Errorf("containerd %s's CRI plugin says pinned %v: docs/operations.md says otherwise", e.d.Version, cri.Kept)
	}

	// A node without a proof of an engine has no such image: with
	// imagePullPolicy: Never kubelet fails the container (ErrImageNeverPull).
	if found, _, raw := e.inspecti("gpupin.local/other:1.0"); found {
		t.Fatalf("CRI knows an image nothing proved: %s", raw)
	}

	// gpupin detect says what this daemon's CRI does with pins.
	node := e.writeJSON("node.json", `{"driver":"575.57.08","cuda":"12.9","gpus":[{"index":0,"uuid":"GPU-1","name":"NVIDIA H100 80GB HBM3","cc":"9.0"}]}`)
	out, err := exec.Command(gpupinBin, "--address", e.d.Address, "--namespace", "k8s.io", "detect", "--node", node).CombinedOutput()
	if err != nil {
		t.Fatalf("gpupin detect: %v\n%s", err, out)
	}
	note := "no notion of pinned images"
	if kept {
		note = "reports pins as pinned"
	}
	seen := fmt.Sprintf("(seen: the CRI plugin reports %s pinned: %v)", local, kept)
	if !strings.Contains(string(out), "containerd:  "+e.d.Version) || !strings.Contains(string(out), note) || !strings.Contains(string(out), seen) {
		t.Fatalf("gpupin detect does not say %q and %q:\n%s", note, seen, out)
	}
	out, err = exec.Command(gpupinBin, "--address", e.d.Address, "--namespace", "k8s.io", "detect", "--node", node, "--json").Output()
	var facts struct {
		Driver     string                 `json:"driver"`
		Containerd *containerd.CRIPinning `json:"containerd"`
	}
	if err != nil || json.Unmarshal(out, &facts) != nil || facts.Driver != "575.57.08" || facts.Containerd == nil ||
		facts.Containerd.How != containerd.CRISeen || facts.Containerd.Kept != kept || facts.Containerd.Image != local {
		t.Fatalf("gpupin detect --json: %v:\n%s", err, out)
	}

	answersFromPin := func(step string) {
		t.Helper()
		e.reg.Reset()
		st := p.Provision(ctx, want)
		if st.State != provision.Ready || !st.FromPin || st.Pinned != st.Pin.Ref || st.Pin.Local != local {
			t.Fatalf("%s: provision %v, want it answered from the pin", step, st)
		}
		if n := len(e.reg.Requests()); n != 0 {
			t.Fatalf("%s: the provision made %d registry requests: %v", step, n, e.reg.Requests())
		}
	}

	// crictl pull of the pinned reference, as kubelet's would be.
	pinnedRef := st.Pinned
	e.reg.Reset()
	e.must("pull", pinnedRef)
	var blobGets []string
	for _, q := range e.reg.Requests() {
		if q.Method == "GET" && strings.Contains(q.Path, "/blobs/") {
			blobGets = append(blobGets, q.Path)
		}
	}
	// Nothing is fetched again, though on 2.x gpupin stored none of the
	// layers it extracted: CRI's unpacker finds their snapshots.
	if len(blobGets) != 0 {
		t.Errorf("containerd %s: crictl pull of the pinned %s fetched blobs again: %v", e.d.Version, pinnedRef, blobGets)
	}
	rec, err := e.rt.Client().ImageService().Get(e.ctx(), pinnedRef)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd %s: record labels after crictl pull %s: %v", e.d.Version, pinnedRef, rec.Labels)
	answersFromPin("after crictl pull")

	// A pod that keeps the sandbox image in use, as running pods do on a
	// node; network 2 is NODE (the host's network: no CNI is needed).
	podCfg := e.writeJSON("pod.json", fmt.Sprintf(`{"metadata":{"name":"engine","namespace":"default","uid":"engine-uid"},"log_directory":%q,"linux":{"security_context":{"namespace_options":{"network":2}}}}`, filepath.Join(e.dir, "logs")))
	pod := strings.TrimSpace(e.must("runp", podCfg))
	defer func() {
		e.crictl("stopp", pod)
		e.crictl("rmp", pod)
	}()

	// crictl rmi --prune: every image no container uses.
	e.must("rmi", "--prune")
	is := e.rt.Client().ImageService()
	_, errPin := is.Get(e.ctx(), pinnedRef)
	_, errLocal := is.Get(e.ctx(), local)
	t.Logf("containerd %s: after crictl rmi --prune: pin record kept %v, local name kept %v", e.d.Version, errPin == nil, errLocal == nil)
	if e.d.Major >= 2 && (errPin != nil || errLocal != nil) {
		t.Fatalf("containerd %s pruned a pinned image: %v, %v", e.d.Version, errPin, errLocal)
	}
	done, err := e.rt.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered: %+v", done)
	if e.d.Major >= 2 && len(done) != 0 {
		t.Errorf("containerd %s kept the pin, yet Recover did %+v", e.d.Version, done)
	}
	if e.d.Major < 2 && (errPin == nil || errLocal == nil) {
		t.Logf("containerd %s kept (part of) the pin through the prune", e.d.Version)
	}
	// CRI learns of restored records from containerd's events.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if found, _, _ := e.inspecti(local); found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRI does not see the restored %s:\n%s", local, e.must("images"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	answersFromPin("after crictl rmi --prune")

	// A container of the pod, from the local name: it runs the variant
	// that was proved (cu129's image says CUDA_VERSION=12.9.0).
	ctrCfg := e.writeJSON("engine.json", fmt.Sprintf(`{"metadata":{"name":"engine"},"image":{"image":%q},"command":["/bin/sh","-c","echo engine CUDA_VERSION=$CUDA_VERSION"],"log_path":"engine.log","linux":{}}`, local))
	id := strings.TrimSpace(e.must("create", pod, ctrCfg, podCfg))
	e.must("start", id)
	deadline = time.Now().Add(30 * time.Second)
	var state string
	for {
		var v struct {
			Status struct {
				State    string `json:"state"`
				ImageRef string `json:"imageRef"`
				Image    struct {
					Image string `json:"image"`
				} `json:"image"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(e.must("inspect", "-o", "json", id)), &v); err != nil {
			t.Fatal(err)
		}
		state = v.Status.State
		if state == "CONTAINER_EXITED" {
			t.Logf("container image %s, imageRef %s", v.Status.Image.Image, v.Status.ImageRef)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine container is still %s", state)
		}
		time.Sleep(50 * time.Millisecond)
	}
	logs := e.must("logs", id)
	if !strings.Contains(logs, "engine CUDA_VERSION=12.9.0") {
		t.Fatalf("the container from %s did not run the proved cu129 image: %q", local, logs)
	}
	e.must("rm", id)

	// With no pin there is no local name: unpin takes it, and CRI forgets it.
	if _, err := e.rt.Unpin(ctx, "demo:1.0"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		if found, _, _ := e.inspecti(local); !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRI still knows %s after unpin", local)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Where the CRI plugin is off (the suite's shared daemon has it disabled),
// CRIPinning says it judged from the version, and why, even with a record
// gpupin labelled pinned in k8s.io to ask about.
func TestCRIPinningJudgedWhenTheCRIPluginIsOff(t *testing.T) {
	rt := testenv.Runtime(t)
	ctx := namespaces.WithNamespace(context.Background(), containerd.CRINamespace)
	is := rt.Client().ImageService()
	name := "gpupin.local/judged:" + strings.ToLower(strings.ReplaceAll(testenv.Namespace(t), "_", "-"))
	rec := images.Image{Name: name, Target: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest,
		Digest: digest.FromString(name), Size: 1},
		Labels: map[string]string{containerd.LabelCRIPinned: "pinned", containerd.LabelManaged: "true", containerd.LabelLocal: "judged:1"}}
	if _, err := is.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { is.Delete(ctx, name) })
	c, err := rt.CRIPinning(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, err := rt.Client().Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := containerd.CRIPinningOf(v.Version)
	if c.How != containerd.CRIJudged || c.Kept != want.Kept || c.Note != want.Note || !strings.Contains(c.Why, "does not serve") {
		t.Fatalf("CRIPinning = %+v; want judged from the version %s because the CRI plugin does not serve", c, v.Version)
	}
}
