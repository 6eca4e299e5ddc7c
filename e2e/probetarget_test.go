package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// selfTestOK is an image's own self-test that passes on a simulated node,
// reporting the simulated GPUs it was told of.
const selfTestOK = `echo "GPUPIN-PROBE {\"ok\":true,\"devices\":$GPUPIN_SIM_DEVICES,\"detail\":\"self-test\"}"`

// `gpupin probe` runs the probe a provision runs, because it reads the
// image as a provision does (provision.ProbeTarget): an upstream image
// without labels in a repository named vllm-openai is engine vllm-openai
// of the vllm family, so the torch probe, in plan, provision and probe
// alike; and an image whose probe is named only by an index annotation
// (docker buildx + gpupin publish) gets that probe when its pin is probed.
// Before, `gpupin probe` read the local config's labels only and ran the
// cuda probe in both. On both registries.
func TestCLISimulatedProbeRunsWhatProvisionRuns(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	ctx := context.Background()
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			c := newCLI(t, nil)
			rt := testenv.Runtime(t)

			t.Run("unlabelled vllm-openai gets the torch probe", func(t *testing.T) {
				// busybox: no python, so the torch probe fails, and says so;
				// the cuda probe would fail for want of a glibc loader.
				img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1"}})
				if err != nil {
					t.Fatal(err)
				}
				ref := reg.Host + "/vllm/vllm-openai:v0.11.0"
				if _, err := sandbox.PushImage(ctx, ref, img); err != nil {
					t.Fatal(err)
				}
				const torchReason = "the torch probe needs Python with PyTorch"

				out, code := c.run("plan", ref, "--json")
				var pl provision.Plan
				if err := json.Unmarshal([]byte(out), &pl); err != nil || code != 0 {
					t.Fatalf("plan exit %d, %v:\n%s", code, err, out)
				}
				if pl.Engine != "vllm-openai" || len(pl.Candidates) != 1 || pl.Candidates[0].Probe != "torch" {
					t.Fatalf("plan: engine %s, candidates %+v; want vllm-openai and the torch probe", pl.Engine, pl.Candidates)
				}

				out, code = c.run("provision", ref)
				if code != 1 || !strings.Contains(out, torchReason) {
					t.Fatalf("provision exit %d, want 1 with %q:\n%s", code, torchReason, out)
				}

				// The candidate provision discarded, pulled as it pulls it.
				pulled, err := rt.Pull(ctx, pl.Candidates[0].Ref, containerd.PullOptions{Platform: "linux/amd64"})
				if err != nil {
					t.Fatal(err)
				}
				out, code = c.run("probe", pulled.Name)
				if code != 1 || !strings.Contains(out, "  probe:  torch (engine vllm-openai, named by the reference;") || !strings.Contains(out, torchReason) {
					t.Fatalf("probe exit %d, want 1 and the torch probe's failure:\n%s", code, out)
				}
				if strings.Contains(out, "glibc") {
					t.Errorf("probe ran the cuda probe:\n%s", out)
				}
			})

			t.Run("probe named only by an index annotation", func(t *testing.T) {
				// The child has no labels and no annotations: only the index
				// entry names the exec probe and its argv.
				img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1"}})
				if err != nil {
					t.Fatal(err)
				}
				argv, _ := json.Marshal([]string{"/bin/sh", "-c", selfTestOK})
				meta := images.Metadata{Engine: "selftest", EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Probe: "exec", ProbeExec: string(argv)}
				ref := sandbox.Publish(t, reg.Host+"/selftest:1.0", sandbox.Variant{Image: img, Meta: meta})
				out, code := c.run("provision", ref, "--json")
				var sts []provision.Status
				if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &sts); err != nil || code != 0 || len(sts) != 1 {
					t.Fatalf("provision exit %d, %v:\n%s", code, err, out)
				}
				if v := sts[0].Verdict; v == nil || v.Runtime["probe"] != "exec" {
					t.Fatalf("provision verdict %+v; want the exec probe", sts[0].Verdict)
				}

				out, code = c.run("probe", sts[0].Pinned, "--json")
				var res struct {
					Target  provision.ProbeTarget `json:"target"`
					Verdict struct {
						Runtime map[string]any `json:"runtime"`
					} `json:"verdict"`
				}
				if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil || code != 0 {
					t.Fatalf("probe exit %d, %v:\n%s", code, err, out)
				}
				if res.Target.Probe != "exec" || res.Target.Engine != "selftest" || res.Target.NamedBy != provision.NamedByPin || res.Verdict.Runtime["probe"] != "exec" {
					t.Fatalf("probe of the pin ran %v (target %+v); want the exec probe of selftest:\n%s", res.Verdict.Runtime["probe"], res.Target, out)
				}
			})
		})
	}
}
