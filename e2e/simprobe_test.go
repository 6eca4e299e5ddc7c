package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/probe"
)

// publishOne pushes img as the one variant (cu129, cuda probe) of host/name:1.0.
func publishOne(t *testing.T, reg *sandbox.Registry, name string, img v1.Image) string {
	t.Helper()
	meta := images.Metadata{Engine: name, EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Probe: "cuda"}
	return sandbox.Publish(t, reg.Host+"/"+name+":1.0", sandbox.Variant{Image: img, Meta: meta})
}

// TestCLISimulatedProbeRunsTheImagesOwnProbe: on a simulated node the CLI
// runs the image's own probe (here the cuda probe) in its simulated mode,
// and says which checks were simulated; an image the probe cannot run in
// fails with the reason.
func TestCLISimulatedProbeRunsTheImagesOwnProbe(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	reg := testenv.Registry(t)
	glibc, err := sandbox.GlibcLayer()
	if err != nil {
		t.Fatal(err)
	}
	distroless, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{glibc}, Env: []string{"PATH=/usr/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	app, err := sandbox.FileLayer(map[string][]byte{"app/engine": []byte("not a program\n")})
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{app}})
	if err != nil {
		t.Fatal(err)
	}
	dlRef, scRef := publishOne(t, reg, "distroless", distroless), publishOne(t, reg, "scratch", scratch)
	c := newCLI(t, reg)

	out, code := c.run("provision", "--json", dlRef)
	if code != 0 {
		t.Fatalf("provision exit %d:\n%s", code, out)
	}
	var sts []struct {
		State   string         `json:"state"`
		Pinned  string         `json:"pinned"`
		Verdict *probe.Verdict `json:"verdict"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &sts); err != nil || len(sts) != 1 {
		t.Fatalf("provision --json: %v\n%s", err, out)
	}
	if v := sts[0].Verdict; v == nil || !v.Simulated || len(v.SimulatedChecks) == 0 {
		t.Fatalf("provision verdict %+v; want simulated checks\n%s", v, out)
	}

	out, code = c.run("probe", "--json", sts[0].Pinned)
	var res struct {
		Verdict probe.Verdict `json:"verdict"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); code != 0 || err != nil {
		t.Fatalf("probe exit %d, %v:\n%s", code, err, out)
	}
	if !strings.Contains(strings.Join(res.Verdict.SimulatedChecks, "\n"), "PTX saxpy") || res.Verdict.Runtime["probe"] != "cuda" {
		t.Fatalf("probe verdict %+v; want the cuda probe's simulated checks", res.Verdict)
	}

	out, code = c.run("provision", scRef)
	if code == 0 || !strings.Contains(out, "this image has no glibc loader; the cuda probe needs glibc") {
		t.Fatalf("provision of a scratch image: exit %d:\n%s", code, out)
	}
}
