package provision

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/runtime"
)

func TestUncoveredGPUs(t *testing.T) {
	gpus := []node.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "H100"}, {Index: 1, UUID: "GPU-bbbb", Name: "L4"}}
	for _, tc := range []struct {
		name string
		gpus []node.GPU
		devs []probe.Device
		want string // "" = covered
	}{
		{"all seen", gpus, []probe.Device{{UUID: "GPU-AAAA"}, {UUID: "gpu-bbbb"}}, ""},
		{"one missing", gpus, []probe.Device{{UUID: "GPU-aaaa"}}, "GPU 1 (L4, GPU-bbbb)"},
		{"wrong one", gpus, []probe.Device{{UUID: "GPU-aaaa"}, {UUID: "GPU-cccc"}}, "GPU 1 (L4, GPU-bbbb)"},
		{"none", gpus, nil, "2 of them (it reported 0 devices)"},
		{"no UUIDs: the count", gpus, []probe.Device{{Index: 0}, {Index: 1}}, ""},
		{"no UUIDs, too few", gpus, []probe.Device{{Index: 0}}, "1 of them (it reported 1 devices)"},
		{"MIG counts instances", []node.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "A100", MIG: "enabled"}}, []probe.Device{{UUID: "MIG-1234"}}, ""},
		{"MIG, too few instances", []node.GPU{{Index: 0, MIG: "enabled"}, {Index: 1, MIG: "enabled"}}, []probe.Device{{UUID: "MIG-1"}}, "1 of them (it reported 1 devices)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(uncovered(tc.gpus, tc.devs), ", "); got != tc.want {
				t.Fatalf("uncovered = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestAllGPUs(t *testing.T) {
	for _, tc := range []struct {
		g    runtime.GPUs
		want bool
	}{
		{runtime.GPUs{Mode: runtime.GPUCDI, Devices: []string{runtime.DefaultCDIDevice}}, true},
		{runtime.GPUs{Mode: runtime.GPUCDI, Devices: []string{"nvidia.com/gpu=0"}}, false},
		{runtime.GPUs{Mode: runtime.GPUNvidiaRuntime}, true},
		{runtime.GPUs{Mode: runtime.GPUNvidiaRuntime, Devices: []string{"0"}}, false},
	} {
		if got := allGPUs(tc.g); got != tc.want {
			t.Errorf("allGPUs(%+v) = %v, want %v", tc.g, got, tc.want)
		}
	}
}
