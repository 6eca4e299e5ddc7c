package provision_test

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
)

// The fast tier: how a probe's output is judged (Probe), on memrt.Runtime.
func TestProbeJudgesTheVerdictSimulated(t *testing.T) {
	h100Device := probe.Device{Index: 0, UUID: testenv.H100UUID, Name: "NVIDIA H100 80GB HBM3", CC: "9.0", TFLOPS: 400}
	real := *h100("580.82.07", "13.0")
	real.Simulated = false
	for _, tc := range []struct {
		name      string
		simulated bool
		output    string
		exit      int
		fails     string // "" passes
		checks    int    // simulated checks the verdict keeps
		twoGPUs   bool   // the node has a second GPU the verdict does not name
	}{
		{"simulated: a passing verdict", true, memrt.Passing(), 0, "", 1, false},
		{"simulated: a verdict that names no simulated check", true, memrt.VerdictLine(probe.Verdict{OK: true, Devices: []probe.Device{h100Device}}), 0, "", 1, false},
		{"simulated: a GPU missing", true, memrt.Passing(), 0, "did not compute on all of the node's 2 GPUs; missing GPU 1 (NVIDIA H100 80GB HBM3, GPU-second)", 0, true},
		{"GPUs: a passing verdict", false, memrt.VerdictLine(probe.Verdict{OK: true, Devices: []probe.Device{h100Device}}), 0, "", 0, false},
		{"GPUs: simulated checks prove nothing", false, memrt.Passing(), 0, "simulated checks on a node with GPUs", 0, false},
		{"GPUs: another GPU's UUID", false, memrt.VerdictLine(probe.Verdict{OK: true, Devices: []probe.Device{{Index: 0, UUID: "GPU-other", CC: "9.0"}}}), 0, "missing", 0, false},
		{"ok:false", true, memrt.VerdictLine(probe.Verdict{OK: false, Devices: []probe.Device{}, Detail: "gemm mismatch"}), 1, "probe failed", 0, false},
		{"ok:true contradicted by the exit code", true, memrt.Passing(), 3, "probe failed", 0, false},
		{"no verdict", true, "Segmentation fault\n", 139, "probe failed", 0, false},
		{"garbled verdict", true, probe.LinePrefix + "{\"ok\":tr\n", 0, "probe failed", 0, false},
		{"a verdict without devices", true, probe.LinePrefix + "{\"ok\":true}\n", 0, "devices", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			facts := h100("580.82.07", "13.0")
			if !tc.simulated {
				facts = &real
			}
			if tc.twoGPUs {
				facts.GPUs = append(facts.GPUs, node.GPU{Index: 1, UUID: "GPU-second", Name: "NVIDIA H100 80GB HBM3", CC: "9.0"})
			}
			m := memrt.New()
			m.SetProbe("img", tc.output, tc.exit)
			p := memProvisioner(t, m, memrt.Resolver{}, facts)
			v, _, err := p.Probe(t.Context(), "img", images.Metadata{Variant: "cu13"}, "demo", facts)
			switch {
			case tc.fails == "" && err != nil:
				t.Fatalf("probe failed: %v", err)
			case tc.fails == "" && (v.Simulated != tc.simulated || len(v.SimulatedChecks) != tc.checks || v.Runtime["probe"] != string(probe.CUDA)):
				t.Fatalf("verdict %+v; want simulated %v with %d simulated checks, probe cuda", v, tc.simulated, tc.checks)
			case tc.fails != "" && (err == nil || !strings.Contains(err.Error(), tc.fails)):
				t.Fatalf("probe: %v, %v; want a failure saying %q", v, err, tc.fails)
			}
		})
	}
}
