//go:build cgo && !nonvml

package node

import (
	"context"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// These tests drive the NVML reader through go-nvml's mock: SIMULATED, no
// GPU is read. The real library is proved on a GPU machine.

type simGPU struct {
	uuid, name string
	brand      nvml.BrandType
	major      int
	minor      int
	memBytes   uint64
	mig        int // -1: NVML says not supported
}

func simDevice(g simGPU) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:                  func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS },
		GetNameFunc:                  func() (string, nvml.Return) { return g.name, nvml.SUCCESS },
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return g.major, g.minor, nvml.SUCCESS },
		GetBrandFunc:                 func() (nvml.BrandType, nvml.Return) { return g.brand, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: g.memBytes}, nvml.SUCCESS
		},
		GetMigModeFunc: func() (int, int, nvml.Return) {
			if g.mig < 0 {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			return g.mig, g.mig, nvml.SUCCESS
		},
	}
}

func simLib(driver string, cuda int, gpus ...simGPU) *mock.Interface {
	devs := make([]nvml.Device, len(gpus))
	for i, g := range gpus {
		devs[i] = simDevice(g)
	}
	return &mock.Interface{
		InitFunc:                          func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                      func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc:        func() (string, nvml.Return) { return driver, nvml.SUCCESS },
		SystemGetCudaDriverVersion_v2Func: func() (int, nvml.Return) { return cuda, nvml.SUCCESS },
		DeviceGetCountFunc:                func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

func TestNVMLReadSimulated(t *testing.T) {
	h100 := simGPU{uuid: "GPU-11111111-2222-3333-4444-555555555555", name: "NVIDIA H100 80GB HBM3", brand: nvml.BRAND_NVIDIA, major: 9, minor: 0, memBytes: 81559 << 20, mig: nvml.DEVICE_MIG_DISABLE}
	a100 := simGPU{uuid: "GPU-aaaa", name: "NVIDIA A100-SXM4-80GB", brand: nvml.BRAND_TESLA, major: 8, minor: 0, memBytes: 81920 << 20, mig: nvml.DEVICE_MIG_ENABLE}
	l4 := simGPU{uuid: "GPU-l4", name: "NVIDIA L4", brand: nvml.BRAND_NVIDIA, major: 8, minor: 9, memBytes: 23034 << 20, mig: -1}

	lib := simLib("580.82.07", 13000, h100, a100, l4)
	f, err := NVML{Lib: lib}.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !f.Supported() || f.Driver != "580.82.07" || f.CUDA != "13.0" || f.Platform != HostPlatform() || f.Simulated {
		t.Fatalf("facts = %+v", f)
	}
	want := []GPU{
		{Index: 0, UUID: h100.uuid, Name: h100.name, Brand: "nvidia", CC: "9.0", MemoryMiB: 81559, MIG: "disabled"},
		{Index: 1, UUID: "GPU-aaaa", Name: a100.name, Brand: "tesla", CC: "8.0", MemoryMiB: 81920, MIG: "enabled"},
		{Index: 2, UUID: "GPU-l4", Name: "NVIDIA L4", Brand: "nvidia", CC: "8.9", MemoryMiB: 23034, MIG: ""},
	}
	if len(f.GPUs) != len(want) {
		t.Fatalf("GPUs = %+v", f.GPUs)
	}
	for i := range want {
		if f.GPUs[i] != want[i] {
			t.Errorf("GPU %d = %+v, want %+v", i, f.GPUs[i], want[i])
		}
	}
	if err := f.Validate(); err != nil {
		t.Errorf("facts read from NVML do not validate: %v", err)
	}
	if len(lib.InitCalls()) != 1 || len(lib.ShutdownCalls()) != 1 {
		t.Errorf("Init called %d times, Shutdown %d: want 1 each", len(lib.InitCalls()), len(lib.ShutdownCalls()))
	}
}

func TestNVMLCUDAVersionsSimulated(t *testing.T) {
	for v, want := range map[int]string{12090: "12.9", 12080: "12.8", 13000: "13.0", 12020: "12.2"} {
		f, err := NVML{Lib: simLib("575.57.08", v, simGPU{uuid: "GPU-x", name: "x", major: 9, mig: -1})}.Read(context.Background())
		if err != nil || f.CUDA != want {
			t.Errorf("cuda %d: facts %+v, %v; want CUDA %s", v, f, err, want)
		}
	}
}

func TestNVMLUnsupportedSimulated(t *testing.T) {
	tests := []struct {
		name string
		lib  *mock.Interface
		want string
	}{
		{"library not found", &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }},
			"no NVIDIA driver (NVML init: ERROR_LIBRARY_NOT_FOUND (12))"},
		{"driver not loaded", &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }},
			"no NVIDIA driver (NVML init: ERROR_DRIVER_NOT_LOADED (9))"},
		{"no permission", &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_NO_PERMISSION }},
			"NVIDIA driver unusable (NVML init: ERROR_NO_PERMISSION (4))"},
		{"zero devices", simLib("580.82.07", 13000), "driver 580.82.07 is loaded but reports no GPUs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NVML{Lib: tc.lib}.Read(context.Background())
			if err != nil {
				t.Fatalf("a node without a usable driver is a result, not an error: %v", err)
			}
			if f.Supported() || f.Unsupported != tc.want {
				t.Errorf("unsupported = %q, want %q", f.Unsupported, tc.want)
			}
			if f.GPUs == nil || len(f.GPUs) != 0 {
				t.Errorf("GPUs = %#v, want an empty list", f.GPUs)
			}
		})
	}
}

func TestNVMLErrorsSimulated(t *testing.T) {
	bad := simLib("580.82.07", 13000, simGPU{uuid: "GPU-x", name: "x", major: 9, mig: -1})
	bad.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	noUUID := simLib("580.82.07", 13000)
	dev := simDevice(simGPU{name: "x", major: 9, mig: -1})
	dev.GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
	noUUID.DeviceGetCountFunc = func() (int, nvml.Return) { return 1, nvml.SUCCESS }
	noUUID.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS }
	noCUDA := simLib("580.82.07", 0)
	noCUDA.SystemGetCudaDriverVersion_v2Func = func() (int, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }

	tests := []struct {
		name string
		lib  *mock.Interface
		want string
	}{
		{"lost GPU", bad, "nvml device 0: ERROR_GPU_IS_LOST"},
		{"no UUID", noUUID, "nvml device 0 uuid: ERROR_UNKNOWN"},
		{"no CUDA version", noCUDA, "nvml CUDA driver version: ERROR_FUNCTION_NOT_FOUND"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NVML{Lib: tc.lib}.Read(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want %q", err, tc.want)
			}
			if len(tc.lib.ShutdownCalls()) != 1 {
				t.Error("NVML not shut down after an error")
			}
		})
	}
}

func TestNVMLCanceledSimulated(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := NVML{Lib: simLib("580.82.07", 13000, simGPU{uuid: "GPU-x", name: "x", major: 9, mig: -1})}.Read(ctx)
	if err == nil {
		t.Error("canceled context: no error")
	}
}

// On this machine (no driver) the real library reports an unsupported node,
// never a crash. On a GPU machine it reads real facts that validate.
func TestNVMLRealLibraryDoesNotCrash(t *testing.T) {
	f, err := NewReader().Read(context.Background())
	if err != nil {
		t.Fatalf("real NVML: %v", err)
	}
	if f.Supported() {
		if err := f.Validate(); err != nil {
			t.Errorf("real facts do not validate: %v", err)
		}
	} else if !strings.Contains(f.Unsupported, "NVML init") && !strings.Contains(f.Unsupported, "reports no GPUs") {
		t.Errorf("unsupported = %q: want the NVML reason", f.Unsupported)
	}
}
