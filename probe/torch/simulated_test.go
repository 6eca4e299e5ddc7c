package torch_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/probe/torch"
)

// simEnv is what gpupin passes the probe on a simulated node.
func simEnv(t *testing.T, devices []probe.Device, nodeCUDA, variantCUDA string) []string {
	t.Helper()
	js, err := json.Marshal(devices)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"GPUPIN_SIMULATED=1", "GPUPIN_SIM_DEVICES=" + string(js),
		"GPUPIN_SIM_NODE_CUDA=" + nodeCUDA, "GPUPIN_SIM_VARIANT_CUDA=" + variantCUDA}
}

var (
	simH100 = probe.Device{Index: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "NVIDIA H100 80GB HBM3", CC: "9.0"}
	simL4   = probe.Device{Index: 1, UUID: "GPU-aaaaaaaa-2222-3333-4444-555555555555", Name: "NVIDIA L4", CC: "8.9"}
	simB200 = probe.Device{Index: 1, UUID: "GPU-bbbbbbbb-2222-3333-4444-555555555555", Name: "NVIDIA B200", CC: "10.0"}
)

// The fake torch of a node without a GPU: CUDA built in, nothing available.
func noGPU(cuda string, archs ...string) fakeTorch {
	return fakeTorch{CUDA: cuda, Available: false, InitError: "Found no NVIDIA driver on your system.", ArchList: archs}
}

func TestTorchProbeSimulatedNodePasses(t *testing.T) {
	tests := []struct {
		name          string
		cfg           fakeTorch
		devices       []probe.Device
		env           []string
		wantArchFrom  string
		wantSimulated []string // each in some simulated check
		wantDetail    []string // each in a device's detail, by index
	}{
		{
			name:    "arch list from the build's flags, engine import needing the driver",
			cfg:     noGPU("12.9", "sm_80", "sm_90", "compute_90"),
			devices: []probe.Device{simH100, simL4},
			env:     []string{"GPUPIN_ENGINE=vllm", "GPUPIN_FAKE_VLLM_C=nodriver"},
			// get_arch_list() answers [] without a GPU: the flags are read instead.
			wantArchFrom:  "torch._C._cuda_getArchFlags()",
			wantSimulated: []string{"import vllm._C (it needs libcuda.so.1", "bf16 matmul", "CUDA driver initialisation"},
			wantDetail:    []string{"kernels: sm_90; simulated", "kernels: sm_80; simulated"},
		},
		{
			name:          "engine and extension import",
			cfg:           noGPU("12.9", "sm_90"),
			env:           []string{"GPUPIN_ENGINE=vllm"},
			wantArchFrom:  "torch._C._cuda_getArchFlags()",
			wantSimulated: []string{"bf16 matmul"},
			wantDetail:    []string{"kernels: sm_90"},
		},
		{
			name:          "no arch list without a GPU: its reach is simulated",
			cfg:           fakeTorch{CUDA: "12.9", ArchList: []string{"sm_90"}, NoArchFlags: true},
			wantArchFrom:  "torch.cuda.get_arch_list()",
			wantSimulated: []string{"the arch list's reach of each GPU"},
			wantDetail:    []string{"torch reports no arch list without a GPU"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := tt.devices
			if devs == nil {
				devs = []probe.Device{simH100}
			}
			out, code := runProbe(t, tt.cfg, append(simEnv(t, devs, "13.0", "12.9"), tt.env...)...)
			v, err := probe.Parse(out, code)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(v.Devices) != len(devs) {
				t.Fatalf("devices = %+v, want %d", v.Devices, len(devs))
			}
			for i, d := range v.Devices {
				if d.UUID != devs[i].UUID || d.CC != devs[i].CC || d.Index != devs[i].Index || d.Name != devs[i].Name {
					t.Errorf("device %d = %+v, want the simulated %+v", i, d, devs[i])
				}
				if i < len(tt.wantDetail) && !strings.Contains(d.Detail, tt.wantDetail[i]) {
					t.Errorf("device %d detail %q, want %q", i, d.Detail, tt.wantDetail[i])
				}
			}
			if v.Runtime["arch_list_from"] != tt.wantArchFrom || v.Runtime["simulated"] != true || v.Runtime["cuda"] != "12.9" {
				t.Errorf("runtime = %v", v.Runtime)
			}
			all := strings.Join(v.SimulatedChecks, "\n")
			for _, w := range tt.wantSimulated {
				if !strings.Contains(all, w) {
					t.Errorf("simulated checks %q lack %q", v.SimulatedChecks, w)
				}
			}
		})
	}
}

func TestTorchProbeSimulatedNodeFailures(t *testing.T) {
	tests := []struct {
		name       string
		cfg        fakeTorch
		devices    []probe.Device
		node       string
		variant    string
		env        []string
		wantDetail string
		wantFailed []int
	}{
		{name: "CPU-only torch", cfg: fakeTorch{CUDA: ""}, wantDetail: "this torch build has no CUDA support (torch.version.cuda is empty)"},
		{name: "torch for another CUDA than the variant's", cfg: noGPU("12.8", "sm_90"), variant: "12.9",
			wantDetail: "torch is built for CUDA 12.8, but the variant says CUDA 12.9"},
		{name: "a driver too old for torch's CUDA", cfg: noGPU("13.0", "sm_90"), variant: "13.0", node: "12.9",
			wantDetail: "torch is built for CUDA 13.0 and the simulated driver supports CUDA 12.9"},
		{name: "no kernels for a GPU", cfg: noGPU("12.9", "sm_80", "sm_90"), devices: []probe.Device{simH100, simB200},
			wantDetail: "GPU 1: this torch build has no kernels for sm_100", wantFailed: []int{1}},
		{name: "arch-specific SASS does not reach another minor", cfg: noGPU("12.9", "sm_90a"), devices: []probe.Device{simL4},
			wantDetail: "no kernels for sm_89", wantFailed: []int{1}},
		{name: "an engine extension broken for other reasons", cfg: noGPU("12.9", "sm_90"), env: []string{"GPUPIN_ENGINE=vllm", "GPUPIN_FAKE_VLLM_C=broken"},
			wantDetail: "engine vllm does not load: import vllm._C: ImportError: libcudart.so.13"},
		{name: "an engine not installed", cfg: noGPU("12.9", "sm_90"), env: []string{"GPUPIN_ENGINE=vllm", "PYTHONPATH=" + mustAbs(t, "testdata/faketorch")},
			wantDetail: "import vllm: ModuleNotFoundError"},
		{name: "no simulated devices", cfg: noGPU("12.9", "sm_90"), devices: []probe.Device{}, wantDetail: "GPUPIN_SIM_DEVICES holds no devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := tt.devices
			if devs == nil {
				devs = []probe.Device{simH100}
			}
			out, code := runProbe(t, tt.cfg, append(simEnv(t, devs, tt.node, tt.variant), tt.env...)...)
			if code != 1 {
				t.Errorf("exit code = %d, want 1; output:\n%s", code, out)
			}
			v, err := probe.Parse(out, code)
			if err == nil || v == nil {
				t.Fatalf("Parse = %+v, %v; want a failed verdict", v, err)
			}
			if !strings.Contains(err.Error(), tt.wantDetail) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.wantDetail)
			}
			var failed []int
			for _, d := range v.Devices {
				if d.OK == nil || !*d.OK {
					failed = append(failed, d.Index)
				}
			}
			if fmt.Sprint(failed) != fmt.Sprint(tt.wantFailed) && !(len(failed) == 0 && len(tt.wantFailed) == 0) {
				t.Errorf("failed devices = %v, want %v", failed, tt.wantFailed)
			}
		})
	}
}

// TestTorchProbeSimulatedArchRulesAreTheChoices checks that the probe's
// arch_match and the choice's rule (images.Archs.Covers) agree on every
// capability and arch list below: a simulated probe passes a GPU exactly
// when the choice would have said the variant covers it.
func TestTorchProbeSimulatedArchRulesAreTheChoices(t *testing.T) {
	ccs := []string{"7.0", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1"}
	lists := [][]string{
		{"sm_80", "sm_90"}, {"sm_80", "sm_86", "sm_90", "compute_90"}, {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_120"},
		{"sm_90a"}, {"compute_90a"}, {"sm_90a", "compute_90"}, {"compute_80"}, {"sm_100f"}, {"sm_100a", "sm_120a"},
		{"sm_70", "sm_75", "compute_75"}, {"sm_86"}, {"compute_70", "sm_90"},
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, torch.ScriptName), torch.Script, 0o444); err != nil {
		t.Fatal(err)
	}
	type query struct {
		CC   [2]int   `json:"cc"`
		List []string `json:"list"`
	}
	var qs []query
	for _, l := range lists {
		for _, c := range ccs {
			cc, err := node.ParseCC(c)
			if err != nil {
				t.Fatal(err)
			}
			qs = append(qs, query{CC: [2]int{cc.Major, cc.Minor}, List: l})
		}
	}
	in, _ := json.Marshal(qs)
	out, err := exec.Command(python(t), "-s", "-B", "-c", `
import json, sys
sys.path.insert(0, sys.argv[1])
import gpupin_probe as p
print(json.dumps([p.arch_match(tuple(q["cc"]), q["list"]) is not None for q in json.loads(sys.argv[2])]))
`, dir, string(in)).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var got []bool
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(qs) {
		t.Fatalf("%v: %s", err, out)
	}
	for i, q := range qs {
		archs, err := images.ParseArchs(torchToArchs(q.List))
		if err != nil {
			t.Fatal(err)
		}
		want := archs.Covers(node.CC{Major: q.CC[0], Minor: q.CC[1]})
		if got[i] != want {
			t.Errorf("cc %d.%d, arch list %v: the probe says %v, the choice (%s) says %v", q.CC[0], q.CC[1], q.List, got[i], archs, want)
		}
	}
}

// torchToArchs writes a torch arch list as the io.gpupin.cuda.archs
// annotation does: sm_90 is 9.0, compute_90 is 9.0+PTX.
func torchToArchs(list []string) string {
	var out []string
	for _, e := range list {
		kind, rest, _ := strings.Cut(e, "_")
		suffix := ""
		if n := len(rest); n > 0 && (rest[n-1] == 'a' || rest[n-1] == 'f') {
			rest, suffix = rest[:n-1], rest[n-1:]
		}
		a := rest[:len(rest)-1] + "." + rest[len(rest)-1:] + suffix
		if kind == "compute" {
			a += "+PTX"
		}
		out = append(out, a)
	}
	return strings.Join(out, ",")
}
