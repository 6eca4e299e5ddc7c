package main

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/probe"
)

const simDevicesJSON = `[{"index":0,"uuid":"GPU-11111111-2222-3333-4444-555555555555","name":"NVIDIA H100 80GB HBM3","cc":"9.0","tflops":0,"max_abs_err":0},` +
	`{"index":1,"uuid":"GPU-22222222-2222-3333-4444-555555555555","name":"NVIDIA H100 80GB HBM3","cc":"9.0","tflops":0,"max_abs_err":0}]`

func TestRunSimulatedNode(t *testing.T) {
	noLib := func() (driver, error) { return nil, errNoLibrary }
	withLib := func() (driver, error) { return &fakeDriver{count: 1}, nil }
	tests := []struct {
		name        string
		open        func() (driver, error)
		devices     string
		wantOK      bool
		wantDetail  string
		wantLibcuda string
	}{
		{name: "no libcuda.so.1, as expected", open: noLib, devices: simDevicesJSON, wantOK: true,
			wantDetail: "the cuda probe starts in this image", wantLibcuda: "not in the image, as expected"},
		{name: "the image has a libcuda.so.1 of its own", open: withLib, devices: simDevicesJSON, wantOK: true,
			wantLibcuda: "the image has a libcuda.so.1 of its own"},
		{name: "no devices", open: noLib, devices: "[]", wantDetail: "holds no devices"},
		{name: "devices not JSON", open: noLib, devices: "[{", wantDetail: "holds no devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := runSimulated(tt.open, tt.devices)
			if v.OK != tt.wantOK || !strings.Contains(v.Detail, tt.wantDetail) {
				t.Fatalf("verdict ok=%v detail %q; want ok=%v, %q", v.OK, v.Detail, tt.wantOK, tt.wantDetail)
			}
			if !tt.wantOK {
				return
			}
			if len(v.Devices) != 2 || v.Devices[1].UUID != "GPU-22222222-2222-3333-4444-555555555555" || v.Devices[1].Index != 1 ||
				v.Devices[1].OK == nil || !*v.Devices[1].OK || v.Devices[0].CC != "9.0" {
				t.Fatalf("devices = %+v", v.Devices)
			}
			if len(v.SimulatedChecks) != len(simulatedChecks) || v.Runtime["simulated"] != true {
				t.Fatalf("simulated checks %q, runtime %v", v.SimulatedChecks, v.Runtime)
			}
			if got, _ := v.Runtime["libcuda"].(string); !strings.Contains(got, tt.wantLibcuda) {
				t.Fatalf("runtime libcuda = %q, want %q", got, tt.wantLibcuda)
			}
		})
	}
}

// TestBinarySimulatedNode runs the probe as shipped, as gpupin runs it on a
// simulated node: no driver library anywhere, and a verdict that passes
// with the driver work marked simulated.
func TestBinarySimulatedNode(t *testing.T) {
	bin, absent := buildProbe(t)
	if hostHasDriver() {
		bin = absent
	}
	out, code := runBinary(t, bin, "LD_LIBRARY_PATH=", "GPUPIN_SIMULATED=1", "GPUPIN_SIM_DEVICES="+simDevicesJSON)
	v, err := probe.Parse(out, code)
	if err != nil {
		t.Fatalf("exit %d, Parse: %v", code, err)
	}
	if len(v.Devices) != 2 || len(v.SimulatedChecks) == 0 {
		t.Fatalf("verdict %+v", v)
	}
	// GPUPIN_SIMULATED=0 is a real run: the missing library fails it.
	out, code = runBinary(t, bin, "LD_LIBRARY_PATH=", "GPUPIN_SIMULATED=0", "GPUPIN_SIM_DEVICES="+simDevicesJSON)
	if v, err := probe.Parse(out, code); err == nil || v == nil || !strings.Contains(v.Detail, "no CUDA driver library") {
		t.Fatalf("GPUPIN_SIMULATED=0: verdict %+v, %v; want the real probe's failure", v, err)
	}
}
