package provision_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

// The tests here run each kind of probe, for real, in its simulated mode,
// in real containers of images made for it: a Debian root filesystem with
// a real (CPU-only) PyTorch, scratch, static busybox, a distroless-style
// glibc image without a shell.

// variantImage is one image of a published test engine, with its metadata.
type variantImage struct {
	meta images.Metadata
	img  v1.Image
}

// publish pushes the images as the variants of host/name:1.0 and returns the tag.
func publish(t *testing.T, reg *sandbox.Registry, name string, vs ...variantImage) string {
	t.Helper()
	var published []sandbox.Variant
	for _, v := range vs {
		v.meta.EngineVersion = "1.0"
		published = append(published, sandbox.Variant{Image: v.img, Meta: v.meta})
	}
	return sandbox.Publish(t, reg.Host+"/"+name+":1.0", published...)
}

func newProvisioner(t *testing.T, rt *containerd.Runtime, facts *node.Facts, extra ...provision.Option) *provision.Provisioner {
	return testenv.Provisioner(t, rt, testOptions(t, testenv.NewNode(facts), extra...)...)
}

func assertNoPins(t *testing.T, rt *containerd.Runtime) {
	t.Helper()
	pins, err := rt.Pins(context.Background())
	if err != nil || len(pins) != 0 {
		t.Fatalf("pins = %+v, %v; want none", pins, err)
	}
}

// dirBytes is the size of the regular files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, de os.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		n += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func hasCheck(v *probe.Verdict, substr string) bool {
	for _, c := range v.SimulatedChecks {
		if strings.Contains(c, substr) {
			return true
		}
	}
	return false
}

// TestSimulatedTorchProbeInRealPython runs the torch probe in a Debian
// root filesystem with python3-torch: the real torch, which has no CUDA,
// fails as it would on a GPU node; the project's stand-in torch module,
// which says it has CUDA 12.9, passes with the device work simulated.
func TestSimulatedTorchProbeInRealPython(t *testing.T) {
	// Root first: TorchLayer builds its root filesystem with mmdebstrap
	// --mode=root, minutes of work that a non-root run must not start.
	testenv.RequireRoot(t)
	ctx := context.Background()
	start := time.Now()
	rootfs, built, err := sandbox.TorchLayer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if built {
		t.Logf("built the torch root filesystem in %s", time.Since(start).Round(time.Second))
	}
	pathEnv := "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	realTorch, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{rootfs}, Env: []string{pathEnv}})
	if err != nil {
		t.Fatal(err)
	}
	// The stand-in torch and engines of probe/torch/testdata, over the
	// same root filesystem: a torch built with CUDA 12.9, on no GPU.
	fakes := map[string][]byte{}
	for _, d := range []string{"faketorch", "fakeengines"} {
		root := filepath.Join("..", "probe", "torch", "testdata", d)
		err := filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || !strings.HasSuffix(p, ".py") {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			data, err := os.ReadFile(p)
			fakes[filepath.Join("opt", d, rel)] = data
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	fakeLayer, err := sandbox.FileLayer(fakes)
	if err != nil {
		t.Fatal(err)
	}
	fakeCfg, _ := json.Marshal(map[string]any{"cuda": "12.9", "available": false, "arch_list": []string{"sm_80", "sm_90"},
		"init_error": "Found no NVIDIA driver on your system."})
	fakeTorch, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{rootfs, fakeLayer}, Env: []string{pathEnv,
		"PYTHONPATH=/opt/faketorch:/opt/fakeengines", "GPUPIN_FAKE_TORCH=" + string(fakeCfg), "GPUPIN_FAKE_VLLM_C=nodriver"}})
	if err != nil {
		t.Fatal(err)
	}

	// The torch layer is about 450 MB compressed: the registry keeps blobs
	// on disk, not in the test's memory (go-containerregistry's default).
	blobs := t.TempDir()
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{BlobDir: blobs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	rt := testenv.Runtime(t)
	meta := images.Metadata{Engine: "vllm", Variant: "cu129", CUDA: "12.9", Archs: "8.0,9.0", Probe: "torch"}
	cpuRef := publish(t, reg, "debian-torch", variantImage{meta, realTorch})
	fakeRef := publish(t, reg, "fake-torch", variantImage{meta, fakeTorch})
	if n := dirBytes(t, blobs); n < 100<<20 {
		t.Fatalf("the registry's blob directory holds %d bytes after the push; want the torch layer there", n)
	}
	facts := h100("575.57.08", "12.9")
	p := newProvisioner(t, rt, facts, provision.WithProbeTimeout(5*time.Minute))

	t.Run("CPU-only torch fails without a pin", func(t *testing.T) {
		// The probe alone first, to time it apart from the pull.
		pullStart := time.Now()
		set, err := (&images.Resolver{}).Resolve(ctx, cpuRef)
		if err != nil {
			t.Fatal(err)
		}
		pulled, err := rt.Pull(ctx, set.Variants[0].Ref, containerd.PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pullTook := time.Since(pullStart)
		probeStart := time.Now()
		v, out, err := p.Probe(ctx, pulled.Name, meta, "vllm", facts)
		t.Logf("pull and unpack %s; simulated torch probe %s", pullTook.Round(time.Millisecond), time.Since(probeStart).Round(time.Millisecond))
		var f *probe.Failure
		if v != nil || !errors.As(err, &f) || !strings.Contains(f.Reason, "this torch build has no CUDA support (torch.version.cuda is empty)") {
			t.Fatalf("Probe = %+v, %v; want the no-CUDA *probe.Failure\n%s", v, err, out)
		}
		// The probe's verdict still names the real torch it found.
		if !strings.Contains(out, `"torch":"1.13`) || !strings.Contains(out, `"simulated":true`) {
			t.Errorf("probe output lacks the torch version or the simulated mark:\n%s", out)
		}

		st := p.Provision(ctx, provision.Want{Ref: cpuRef})
		if len(st.Attempts) != 1 || st.Attempts[0].Stage != "probe" {
			t.Fatalf("attempts %+v: %s", st.Attempts, st.Detail)
		}
		if f := probeFailure(t, st); !strings.Contains(f.Reason, "this torch build has no CUDA support (torch.version.cuda is empty)") {
			t.Errorf("reason lacks the no-CUDA reason: %q", f.Reason)
		}
		assertNoPins(t, rt)
	})

	t.Run("stand-in torch with CUDA passes, device work simulated", func(t *testing.T) {
		st := p.Provision(ctx, provision.Want{Ref: fakeRef})
		if st.State != provision.Ready || !st.Simulated || st.Verdict == nil {
			t.Fatalf("state %s: %s\n%s", st.State, st.Detail, st.ProbeOutput)
		}
		v := st.Verdict
		if !v.Simulated || v.Runtime["probe"] != "torch" || v.Runtime["arch_list_from"] != "torch._C._cuda_getArchFlags()" {
			t.Errorf("verdict = %+v", v)
		}
		if len(v.Devices) != 1 || v.Devices[0].UUID != testenv.H100UUID || !strings.Contains(v.Devices[0].Detail, "kernels: sm_90") {
			t.Errorf("devices = %+v", v.Devices)
		}
		for _, c := range []string{"bf16 matmul", "CUDA driver initialisation", "import vllm._C (it needs libcuda.so.1"} {
			if !hasCheck(v, c) {
				t.Errorf("simulated checks %q lack %q", v.SimulatedChecks, c)
			}
		}
		pin, err := rt.GetPin(ctx, "vllm:1.0")
		if err != nil || pin == nil || !pin.Simulated {
			t.Fatalf("pin = %+v, %v", pin, err)
		}
	})
}

// TestSimulatedCUDAProbeNeedsGlibc runs the cuda probe in images without a
// glibc loader: it cannot start there on any node, and the reason says so.
func TestSimulatedCUDAProbeNeedsGlibc(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	ctx := context.Background()
	app, err := sandbox.FileLayer(map[string][]byte{"app/engine": []byte("#!not really\n")})
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{app}, Env: []string{"PATH=/app"}})
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := sandbox.Image(sandbox.ImageSpec{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		img  v1.Image
	}{{"scratch", scratch}, {"static busybox", busybox}} {
		t.Run(tc.name, func(t *testing.T) {
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			ref := publish(t, reg, "app", variantImage{images.Metadata{Engine: "app", Variant: "cu129", CUDA: "12.9", Probe: "cuda"}, tc.img})
			st := newProvisioner(t, rt, h100("575.57.08", "12.9")).Provision(ctx, provision.Want{Ref: ref})
			f := probeFailure(t, st)
			if !strings.HasPrefix(f.Reason, "this image has no glibc loader; the cuda probe needs glibc") {
				t.Fatalf("reason %q", f.Reason)
			}
			if strings.Contains(f.Reason, "no such file or directory") {
				t.Errorf("the reason still reads as a missing file: %s", f.Reason)
			}
			assertNoPins(t, rt)
		})
	}
}

// TestSimulatedDistrolessImage runs probes in an image with glibc and
// nothing else, no shell: the cuda probe and the sim probe both need none.
func TestSimulatedDistrolessImage(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	ctx := context.Background()
	glibc, err := sandbox.GlibcLayer()
	if err != nil {
		t.Fatal(err)
	}
	image := func(env ...string) v1.Image {
		img, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{glibc}, Env: append([]string{"PATH=/usr/bin"}, env...)})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	meta := images.Metadata{Engine: "app", Variant: "cu129", CUDA: "12.9", Probe: "cuda"}
	tests := []struct {
		name       string
		img        v1.Image
		wantState  provision.State
		wantDetail string   // in the status detail (failures)
		wantChecks []string // in the verdict's simulated checks
		wantOutput []string // in the probe output
	}{
		{
			name: "cuda probe", img: image(), wantState: provision.Ready,
			wantChecks: []string{"libcuda.so.1 from the node's driver", "PTX saxpy"},
			wantOutput: []string{`"libcuda":"not in the image, as expected`},
		},
		{
			name: "emulated by the sim probe", img: image("GPUPIN_SIM_PROBE=emulate", "CUDA_VERSION=12.9.1"), wantState: provision.Ready,
			wantChecks: []string{"emulated by gpupin-sim-probe"},
			// The box, as the container sees it, with no shell to look.
			wantOutput: []string{"GPUPIN-SIM net=lo\n", "GPUPIN-SIM rootfs-writable=no\n", "GPUPIN-SIM capeff=0000000000000000\n", "GPUPIN-SIM nonewprivs=1\n"},
		},
		{
			name: "sim probe told to fail", img: image("GPUPIN_SIM_PROBE=fail"), wantState: provision.Failed,
			wantDetail: "simulated failure: GPUPIN_SIM_PROBE=fail",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			ref := publish(t, reg, "app", variantImage{meta, tt.img})
			st := newProvisioner(t, rt, h100("575.57.08", "12.9")).Provision(ctx, provision.Want{Ref: ref})
			if tt.wantState != provision.Ready {
				if f := probeFailure(t, st); !strings.Contains(f.Reason, tt.wantDetail) {
					t.Fatalf("reason %q, want %q", f.Reason, tt.wantDetail)
				}
				assertNoPins(t, rt)
				return
			}
			if st.State != provision.Ready {
				t.Fatalf("state %s, want ready: %s", st.State, st.Detail)
			}
			for _, c := range tt.wantChecks {
				if !hasCheck(st.Verdict, c) {
					t.Errorf("simulated checks %q lack %q", st.Verdict.SimulatedChecks, c)
				}
			}
			for _, o := range tt.wantOutput {
				if !strings.Contains(st.ProbeOutput, o) {
					t.Errorf("probe output lacks %q:\n%s", o, st.ProbeOutput)
				}
			}
			if len(st.Verdict.Devices) != 1 || st.Verdict.Devices[0].UUID != testenv.H100UUID {
				t.Errorf("devices = %+v", st.Verdict.Devices)
			}
		})
	}
}

// selfTest is an image's own self-test (the exec probe), a shell script on
// busybox: it reports the simulated devices when told the node is
// simulated (or $SELFTEST_DEVICES in their place), what it would otherwise
// have done on a GPU.
const selfTest = `if [ "$GPUPIN_SIMULATED" = 1 ]; then
  echo "GPUPIN-PROBE {\"ok\":$SELFTEST_OK,\"devices\":${SELFTEST_DEVICES:-$GPUPIN_SIM_DEVICES},\"detail\":\"self-test: simulated node $GPUPIN_SIM_NODE_CUDA\"}"
else
  echo "GPUPIN-PROBE {\"ok\":false,\"devices\":[],\"detail\":\"self-test: GPUPIN_SIMULATED=$GPUPIN_SIMULATED, a real node\"}"
fi
[ "$SELFTEST_OK" = true ]`

func TestSimulatedExecProbeSelfTestVerdictCounts(t *testing.T) {
	ctx := context.Background()
	argv, _ := json.Marshal([]string{"/bin/sh", "-c", selfTest})
	for _, tc := range []struct {
		name       string
		env        []string
		wantState  provision.State
		wantReason string
	}{
		{"ok", []string{"SELFTEST_OK=true"}, provision.Ready, ""},
		{"not ok", []string{"SELFTEST_OK=false"}, provision.Failed, "self-test: simulated node 12.9"},
		// A passing verdict on another device than the node's proves
		// nothing here: on a simulated node the hint is the simulated
		// devices, not CUDA_VISIBLE_DEVICES or a CDI spec.
		{"another device", []string{"SELFTEST_OK=true", `SELFTEST_DEVICES=[{"index":0,"uuid":"GPU-other","name":"x","cc":"9.0"}]`}, provision.Failed,
			"missing GPU 0 (NVIDIA H100 80GB HBM3, " + testenv.H100UUID + ") (on a simulated node the exec probe must report the devices of $GPUPIN_SIM_DEVICES as its own)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := sandbox.Image(sandbox.ImageSpec{Env: tc.env})
			if err != nil {
				t.Fatal(err)
			}
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			ref := publish(t, reg, "selftest", variantImage{images.Metadata{Engine: "selftest", Variant: "cu129", CUDA: "12.9", Probe: "exec", ProbeExec: string(argv)}, img})
			st := newProvisioner(t, rt, h100("575.57.08", "12.9")).Provision(ctx, provision.Want{Ref: ref})
			if tc.wantState != provision.Ready {
				if f := probeFailure(t, st); !strings.Contains(f.Reason, tc.wantReason) || strings.Contains(f.Reason, "CUDA_VISIBLE_DEVICES") {
					t.Fatalf("reason %q, want %q\n%s", f.Reason, tc.wantReason, st.ProbeOutput)
				}
				assertNoPins(t, rt)
				return
			}
			// The self-test named no simulated checks: gpupin says what was not done.
			if v := st.Verdict; st.State != provision.Ready || !v.Simulated || !hasCheck(v, "all device work") || v.Runtime["probe"] != "exec" {
				t.Fatalf("%s; verdict = %+v", st, v)
			}
		})
	}
}

// TestSimulatedModeRefusedOnRealNode runs probes on facts that are not
// simulated (with no GPU injected, since this machine has none): an image
// cannot switch a probe into its simulated mode, and a verdict that names
// simulated checks proves nothing there.
func TestSimulatedModeRefusedOnRealNode(t *testing.T) {
	ctx := context.Background()
	realNode := *h100("575.57.08", "12.9")
	realNode.Simulated = false
	tests := []struct {
		name       string
		script     string
		wantReason string
	}{
		{
			name:       "image sets it",
			script:     `echo "GPUPIN-PROBE {\"ok\":false,\"devices\":[],\"detail\":\"GPUPIN_SIMULATED=$GPUPIN_SIMULATED\"}"; exit 1`,
			wantReason: "GPUPIN_SIMULATED=0",
		},
		{
			name: "simulated checks",
			script: `echo 'GPUPIN-PROBE {"ok":true,"devices":[{"index":0,"uuid":"` + testenv.H100UUID +
				`","name":"x","cc":"9.0","tflops":1,"max_abs_err":0}],"simulated_checks":["the matmul"]}'`,
			wantReason: "the probe simulated checks on a node with GPUs (the matmul)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, _ := json.Marshal([]string{"/bin/sh", "-c", tt.script})
			img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"GPUPIN_SIMULATED=1"}})
			if err != nil {
				t.Fatal(err)
			}
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			ref := publish(t, reg, "selftest", variantImage{images.Metadata{Engine: "selftest", Variant: "cu129", CUDA: "12.9", Probe: "exec", ProbeExec: string(argv)}, img})
			p := newProvisioner(t, rt, &realNode, provision.WithGPUs(containerd.GPUs{Mode: containerd.GPUNone}))
			st := p.Provision(ctx, provision.Want{Ref: ref})
			if f := probeFailure(t, st); !strings.Contains(f.Reason, tt.wantReason) {
				t.Fatalf("reason %q, want %q", f.Reason, tt.wantReason)
			}
			assertNoPins(t, rt)
		})
	}
}
