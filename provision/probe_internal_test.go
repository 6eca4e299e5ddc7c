package provision

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
)

func TestUncoveredGPUs(t *testing.T) {
	gpus := []node.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "H100"}, {Index: 1, UUID: "GPU-bbbb", Name: "L4"}}
	mig := []node.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "A100", MIG: "enabled"}}
	noUUIDs := []probe.Device{{Index: 0}, {Index: 1}}
	for _, tc := range []struct {
		name    string
		kind    probe.Kind
		gpus    []node.GPU
		devs    []probe.Device
		want    string // "" = covered
		wantErr string
	}{
		{"all seen", probe.Torch, gpus, []probe.Device{{UUID: "GPU-AAAA"}, {UUID: "gpu-bbbb"}}, "", ""},
		{"one missing", probe.CUDA, gpus, []probe.Device{{UUID: "GPU-aaaa"}}, "GPU 1 (L4, GPU-bbbb)", ""},
		{"wrong one", probe.Torch, gpus, []probe.Device{{UUID: "GPU-aaaa"}, {UUID: "GPU-cccc"}}, "GPU 1 (L4, GPU-bbbb)", ""},
		{"none", probe.Exec, gpus, nil, "2 of them (it reported 0 devices)", ""},
		{"exec, no UUIDs: the count", probe.Exec, gpus, noUUIDs, "", ""},
		{"exec, no UUIDs, too few", probe.Exec, gpus, []probe.Device{{Index: 0}}, "1 of them (it reported 1 devices)", ""},
		{"simulated emulator, no UUIDs: the count", probe.Sim, gpus, noUUIDs, "", ""},
		{"torch, no UUIDs", probe.Torch, gpus, noUUIDs, "", "the torch probe reported device 0, device 1 without a UUID"},
		{"cuda, no UUIDs", probe.CUDA, gpus, noUUIDs, "", "the cuda probe reported device 0, device 1 without a UUID"},
		{"cuda, one without", probe.CUDA, gpus, []probe.Device{{Index: 0, UUID: "GPU-aaaa"}, {Index: 1}}, "", "the cuda probe reported device 1 without a UUID"},
		{"MIG counts instances", probe.Torch, mig, []probe.Device{{UUID: "MIG-1234"}}, "", ""},
		{"MIG, too few instances", probe.Exec, []node.GPU{{Index: 0, MIG: "enabled"}, {Index: 1, MIG: "enabled"}}, []probe.Device{{UUID: "MIG-1"}}, "1 of them (it reported 1 devices)", ""},
		{"MIG, torch without UUIDs", probe.Torch, mig, []probe.Device{{Index: 0}}, "", "without a UUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing, err := uncovered(tc.kind, tc.gpus, tc.devs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("uncovered = %q, %v; want an error with %q", missing, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("uncovered: %v", err)
			}
			if got := strings.Join(missing, ", "); got != tc.want {
				t.Fatalf("uncovered = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestAllGPUs(t *testing.T) {
	for _, tc := range []struct {
		g    containerd.GPUs
		want bool
	}{
		{containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{containerd.DefaultCDIDevice}}, true},
		{containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"nvidia.com/gpu=0"}}, false},
		{containerd.GPUs{Mode: containerd.GPUNvidiaRuntime}, true},
		{containerd.GPUs{Mode: containerd.GPUNvidiaRuntime, Devices: []string{"0"}}, false},
	} {
		if got := allGPUs(tc.g); got != tc.want {
			t.Errorf("allGPUs(%+v) = %v, want %v", tc.g, got, tc.want)
		}
	}
}

// Where to look when a verdict misses GPUs: on a simulated node no device
// is visible, and the probe must report the simulated ones.
func TestCoverageHint(t *testing.T) {
	for _, tc := range []struct {
		kind      probe.Kind
		simulated bool
		want      string
	}{
		{probe.Exec, true, "on a simulated node the exec probe must report the devices of $GPUPIN_SIM_DEVICES as its own"},
		{probe.Torch, true, "on a simulated node the torch probe must report the devices of $GPUPIN_SIM_DEVICES as its own"},
		{probe.Exec, false, "is CUDA_VISIBLE_DEVICES set in the image, or the CDI spec stale?"},
	} {
		r := &probeRun{kind: tc.kind}
		if got := r.coverageHint(&node.Facts{Simulated: tc.simulated}); got != tc.want {
			t.Errorf("hint for %s (simulated %v) = %q, want %q", tc.kind, tc.simulated, got, tc.want)
		}
	}
}
