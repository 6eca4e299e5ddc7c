package torch_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/probe/torch"
)

// fakeDevice and fakeTorch mirror the GPUPIN_FAKE_TORCH contract of testdata/faketorch.
type fakeDevice struct {
	Name     string `json:"name"`
	CC       [2]int `json:"cc"`
	UUID     string `json:"uuid,omitempty"`
	Mismatch bool   `json:"mismatch,omitempty"`
	NaN      bool   `json:"nan,omitempty"`
	Raise    string `json:"raise,omitempty"`
}

type fakeTorch struct {
	CUDA      string       `json:"cuda"`
	Available bool         `json:"available"`
	Warning   string       `json:"warning,omitempty"`
	InitError string       `json:"init_error,omitempty"`
	ArchList  []string     `json:"arch_list"`
	Devices   []fakeDevice `json:"devices"`
	// NoArchFlags: torch._C has no _cuda_getArchFlags, as in CPU-only builds.
	NoArchFlags bool `json:"no_arch_flags,omitempty"`
}

func python(t *testing.T) string {
	t.Helper()
	skipShort(t)
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to test the torch probe: %v", err)
	}
	return p
}

var (
	libOnce sync.Once
	libDirs map[string]string
	libErr  error
)

// fakeCUDA is the stand-in driver library the cuda probe's tests build
// (cmd/gpupin-cuda-probe/testdata/fakecuda.c), as a directory holding
// libcuda.so.1, built with gcc once per variant: "" (cuDeviceGetUuid_v2),
// "old" (cuDeviceGetUuid only) or "bare" (cuInit only).
func fakeCUDA(t *testing.T, variant string) string {
	t.Helper()
	skipShort(t)
	libOnce.Do(func() {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			libErr = fmt.Errorf("gcc is needed to build the stand-in libcuda.so.1: %w", err)
			return
		}
		src, err := filepath.Abs("../../cmd/gpupin-cuda-probe/testdata/fakecuda.c")
		if err != nil {
			libErr = err
			return
		}
		libDirs = map[string]string{}
		for v, defs := range map[string][]string{"": nil, "old": {"-DOLD_UUID"}, "bare": {"-DONLY_INIT"}} {
			dir, err := os.MkdirTemp("", "gpupin-fake-libcuda-")
			if err != nil {
				libErr = err
				return
			}
			args := append([]string{"-Wall", "-Werror", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1")}, defs...)
			out, err := exec.Command(gcc, append(args, src)...).CombinedOutput()
			if err != nil {
				libErr = fmt.Errorf("gcc %v: %w\n%s", defs, err, out)
				return
			}
			libDirs[v] = dir
		}
	})
	if libErr != nil {
		t.Fatal(libErr)
	}
	return libDirs[variant]
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range libDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// runProbe runs the embedded script, as gpupin ships it, against the fake
// torch, with the stand-in libcuda.so.1 as the driver torch loaded (env may
// name another LD_LIBRARY_PATH).
func runProbe(t *testing.T, cfg fakeTorch, env ...string) ([]byte, int) {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, torch.ScriptName)
	if err := os.WriteFile(script, torch.Script, 0o444); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	td, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(t), "-s", script)
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+filepath.Join(td, "faketorch")+":"+filepath.Join(td, "fakeengines"),
		"GPUPIN_FAKE_TORCH="+string(js),
		"GPUPIN_ENGINE=",
		"HOME="+dir,
		"LD_LIBRARY_PATH="+fakeCUDA(t, ""),
		"GPUPIN_FAKE_CUDA=ok",
	)
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run probe: %v", err)
	}
	return out.Bytes(), code
}

var (
	h200 = fakeDevice{Name: "NVIDIA H200", CC: [2]int{9, 0}, UUID: "0f1e2d3c-aaaa-bbbb-cccc-000000000001"}
	l4   = fakeDevice{Name: "NVIDIA L4", CC: [2]int{8, 9}}
	b200 = fakeDevice{Name: "NVIDIA B200", CC: [2]int{10, 0}}
)

func TestTorchProbeSimulatedPass(t *testing.T) {
	out, code := runProbe(t, fakeTorch{
		CUDA: "12.9", Available: true,
		ArchList: []string{"sm_80", "sm_90"},
		Devices:  []fakeDevice{h200, l4},
	}, "GPUPIN_ENGINE=vllm")
	v, err := probe.Parse(out, code)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	// The H200's UUID from torch's properties; the L4 has none there (an
	// older torch), so the driver's is read: device 1 of the stand-in.
	if len(v.Devices) != 2 || v.Devices[0].UUID != "GPU-"+h200.UUID || v.Devices[0].CC != "9.0" || v.Devices[1].CC != "8.9" ||
		v.Devices[1].UUID != "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f" {
		t.Fatalf("devices = %+v", v.Devices)
	}
	// 8.9 runs sm_80 SASS; 9.0 has its own.
	if !strings.Contains(v.Devices[0].Detail, "sm_90") || !strings.Contains(v.Devices[1].Detail, "sm_80") {
		t.Fatalf("kernel details = %q, %q", v.Devices[0].Detail, v.Devices[1].Detail)
	}
	if v.Devices[0].TFLOPS <= 0 {
		t.Fatalf("tflops = %v, want > 0", v.Devices[0].TFLOPS)
	}
	for k, want := range map[string]any{"torch": "2.8.0+fake", "cuda": "12.9", "vllm": "0.11.0+fake", "engine_import": "vllm vllm._C"} {
		if v.Runtime[k] != want {
			t.Errorf("runtime[%q] = %v, want %v", k, v.Runtime[k], want)
		}
	}
}

func TestTorchProbeSimulatedFailures(t *testing.T) {
	tests := []struct {
		name       string
		cfg        fakeTorch
		env        []string
		wantDetail string
		wantFailed []int // device indexes that must report ok:false
	}{
		{
			name:       "arch missing",
			cfg:        fakeTorch{CUDA: "12.4", Available: true, ArchList: []string{"sm_80", "sm_90"}, Devices: []fakeDevice{h200, b200}},
			wantDetail: "no kernels for sm_100",
			wantFailed: []int{1},
		},
		{
			name:       "arch-specific build does not run elsewhere",
			cfg:        fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_90a"}, Devices: []fakeDevice{l4}},
			wantDetail: "no kernels for sm_89",
			wantFailed: []int{0},
		},
		{
			name:       "numeric mismatch",
			cfg:        fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_90"}, Devices: []fakeDevice{h200, {Name: "bad", CC: [2]int{9, 0}, Mismatch: true}}},
			wantDetail: "does not match the float32 reference",
			wantFailed: []int{1},
		},
		{
			name:       "NaN result",
			cfg:        fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_90"}, Devices: []fakeDevice{{Name: "nan", CC: [2]int{9, 0}, NaN: true}}},
			wantDetail: "non-finite",
			wantFailed: []int{0},
		},
		{
			name:       "kernel launch raises",
			cfg:        fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_90"}, Devices: []fakeDevice{{Name: "x", CC: [2]int{9, 0}, Raise: "CUDA error: no kernel image is available for execution on the device"}}},
			wantDetail: "RuntimeError: CUDA error: no kernel image is available",
			wantFailed: []int{0},
		},
		{
			name:       "engine import failure",
			cfg:        fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_90"}, Devices: []fakeDevice{h200}},
			env:        []string{"GPUPIN_ENGINE=vllm", "GPUPIN_FAKE_VLLM_C=broken"},
			wantDetail: "engine vllm does not load: import vllm._C: ImportError: libcudart.so.13",
		},
		{
			name:       "engine not installed",
			cfg:        fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_90"}, Devices: []fakeDevice{h200}},
			env:        []string{"GPUPIN_ENGINE=vllm", "PYTHONPATH=" + mustAbs(t, "testdata/faketorch")},
			wantDetail: "import vllm: ModuleNotFoundError",
		},
		{
			name:       "no GPU visible",
			cfg:        fakeTorch{CUDA: "13.0", Available: false, Warning: "CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."},
			wantDetail: "no CUDA devices visible to torch: CUDA initialization: The NVIDIA driver on your system is too old",
		},
		{
			name:       "no GPU visible, reason from init",
			cfg:        fakeTorch{CUDA: "12.9", Available: false, InitError: "Found no NVIDIA driver on your system."},
			wantDetail: "no CUDA devices visible to torch: RuntimeError: Found no NVIDIA driver",
		},
		{
			name:       "CPU-only torch",
			cfg:        fakeTorch{CUDA: "", Available: false},
			wantDetail: "no CUDA support",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code := runProbe(t, tt.cfg, tt.env...)
			if code != 1 {
				t.Errorf("exit code = %d, want 1; output:\n%s", code, out)
			}
			v, err := probe.Parse(out, code)
			if err == nil {
				t.Fatalf("Parse accepted a failing probe: %+v", v)
			}
			if v == nil {
				t.Fatalf("no verdict parsed: %v", err)
			}
			if !strings.Contains(err.Error(), tt.wantDetail) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.wantDetail)
			}
			failed := map[int]bool{}
			for _, d := range v.Devices {
				if d.OK == nil || !*d.OK {
					failed[d.Index] = true
				}
			}
			for _, i := range tt.wantFailed {
				if !failed[i] {
					t.Errorf("device %d not reported failed: %+v", i, v.Devices)
				}
			}
			if len(failed) != len(tt.wantFailed) {
				t.Errorf("failed devices = %v, want %v", failed, tt.wantFailed)
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Each device is named by its UUID as NVML prints it: from torch's device
// properties (PyTorch 2.x), else from the driver torch loaded
// (cuDeviceGetUuid_v2, else cuDeviceGetUuid). A device whose UUID cannot
// be read fails, saying why.
func TestTorchProbeSimulatedDeviceUUIDs(t *testing.T) {
	cfg := fakeTorch{CUDA: "12.9", Available: true, ArchList: []string{"sm_80", "sm_90"}}
	withUUID := fakeDevice{Name: "NVIDIA H200", CC: [2]int{9, 0}, UUID: "0f1e2d3c-aaaa-bbbb-cccc-000000000001"}
	noUUID := fakeDevice{Name: "NVIDIA H200", CC: [2]int{9, 0}}
	const dev0, dev1 = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"
	for _, tc := range []struct {
		name       string
		devices    []fakeDevice
		lib        string // fakeCUDA variant
		fakeMode   string // GPUPIN_FAKE_CUDA
		wantUUIDs  []string
		wantDetail string // "" = passes
		wantFailed []int
	}{
		{"torch's own, prefixed as NVML prints it", []fakeDevice{withUUID}, "", "ok", []string{"GPU-" + withUUID.UUID}, "", nil},
		{"torch's own, already prefixed", []fakeDevice{{Name: "x", CC: [2]int{9, 0}, UUID: "GPU-" + withUUID.UUID}}, "", "ok", []string{"GPU-" + withUUID.UUID}, "", nil},
		{"driver's cuDeviceGetUuid_v2", []fakeDevice{noUUID, noUUID}, "", "ok", []string{dev0, dev1}, "", nil},
		{"driver's cuDeviceGetUuid", []fakeDevice{noUUID, noUUID}, "old", "ok", []string{dev0, dev1}, "", nil},
		{"driver fails on one device", []fakeDevice{noUUID, noUUID}, "", "nouuid", []string{dev0, ""},
			"GPU 1's UUID: cuDeviceGetUuid_v2 failed with CUresult 801", []int{1}},
		{"driver has no uuid call", []fakeDevice{noUUID}, "bare", "ok", []string{""},
			"libcuda.so.1 has neither cuDeviceGetUuid_v2 nor cuDeviceGetUuid", []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.Devices = tc.devices
			out, code := runProbe(t, c, "LD_LIBRARY_PATH="+fakeCUDA(t, tc.lib), "GPUPIN_FAKE_CUDA="+tc.fakeMode)
			v, err := probe.Parse(out, code)
			if tc.wantDetail == "" {
				if err != nil || code != 0 {
					t.Fatalf("exit %d, Parse: %v\n%s", code, err, out)
				}
			} else if v == nil || err == nil || code != 1 || !strings.Contains(err.Error(), tc.wantDetail) {
				t.Fatalf("exit %d, verdict %+v, error %v; want a failure with %q\n%s", code, v, err, tc.wantDetail, out)
			}
			if len(v.Devices) != len(tc.wantUUIDs) {
				t.Fatalf("devices %+v", v.Devices)
			}
			for i, d := range v.Devices {
				if d.UUID != tc.wantUUIDs[i] {
					t.Errorf("device %d UUID %q, want %q", i, d.UUID, tc.wantUUIDs[i])
				}
				failed := d.OK == nil || !*d.OK
				if failed != slices.Contains(tc.wantFailed, i) {
					t.Errorf("device %d failed %v: %s", i, failed, d.Detail)
				}
			}
		})
	}
}

// TestTorchProbeSimulatedArchRules checks arch_match, the rule for whether a
// build's kernels reach a device, directly.
func TestTorchProbeSimulatedArchRules(t *testing.T) {
	tests := []struct {
		cc   [2]int
		list []string
		want string // "" = not reachable
	}{
		{[2]int{9, 0}, []string{"sm_80", "sm_90"}, "sm_90"},
		{[2]int{8, 9}, []string{"sm_80", "sm_86", "sm_90"}, "sm_86"},
		{[2]int{8, 6}, []string{"sm_90", "sm_100"}, ""},
		{[2]int{10, 0}, []string{"sm_90", "compute_90"}, "compute_90 (PTX JIT)"},
		{[2]int{12, 0}, []string{"sm_100", "sm_120"}, "sm_120"},
		{[2]int{12, 1}, []string{"sm_100", "sm_120a"}, ""},
		{[2]int{9, 0}, []string{"sm_90a"}, "sm_90a"},
		{[2]int{10, 0}, []string{"compute_90a"}, ""},
		{[2]int{7, 5}, []string{"compute_80"}, ""},
		{[2]int{8, 0}, []string{"bogus", "sm_", "sm_8x", "sm_80"}, "sm_80"},
		{[2]int{10, 3}, []string{"sm_100f"}, "sm_100f"},
	}
	type result struct {
		Got string `json:"got"`
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, torch.ScriptName), torch.Script, 0o444); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		in, _ := json.Marshal(map[string]any{"cc": tt.cc, "list": tt.list})
		cmd := exec.Command(python(t), "-s", "-B", "-c", `
import json, sys
sys.path.insert(0, sys.argv[1])
import gpupin_probe as p
a = json.loads(sys.argv[2])
print(json.dumps({"got": p.arch_match(tuple(a["cc"]), a["list"]) or ""}))
`, dir, string(in))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var r result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if r.Got != tt.want {
			t.Errorf("arch_match(%v, %v) = %q, want %q", tt.cc, tt.list, r.Got, tt.want)
		}
	}
}

func TestTorchProbeCompiles(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, torch.ScriptName)
	if err := os.WriteFile(script, torch.Script, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(python(t), "-m", "py_compile", script).CombinedOutput(); err != nil {
		t.Fatalf("py_compile: %v\n%s", err, out)
	}
}

// skipShort: these run the shipped script in python3 against a stand-in
// libcuda built by gcc, seconds each; the fast tier (-short) does not.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs the probe in python3 with a stand-in libcuda built by gcc (make test runs it)")
	}
}
