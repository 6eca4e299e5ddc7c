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
		{"none", gpus, nil, "GPU 0 (H100, GPU-aaaa), GPU 1 (L4, GPU-bbbb)"},
		{"MIG counts instances", []node.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "A100", MIG: "enabled"}}, []probe.Device{{UUID: "MIG-1234"}}, ""},
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
