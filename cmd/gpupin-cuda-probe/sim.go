package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gpupin/gpupin/probe"
)

// simulatedChecks are what the probe does not do on a simulated node: all
// of it needs the node's driver, which the GPU injection brings.
var simulatedChecks = []string{
	"libcuda.so.1 from the node's driver, cuInit and the device count",
	"PTX saxpy (JIT-loaded, run, every element checked, timed) on each GPU",
}

// runSimulated is the probe on a simulated node (GPUPIN_SIMULATED=1): that
// it runs at all proves the image has the glibc loader and libraries it
// needs; the driver library is expected to be missing, and every step that
// needs it is reported simulated, for the devices gpupin passed in
// devicesJSON (GPUPIN_SIM_DEVICES).
func runSimulated(open func() (driver, error), devicesJSON string) *probe.Verdict {
	v := &probe.Verdict{Devices: []probe.Device{}, Runtime: map[string]any{"probe": "cuda", "simulated": true}}
	var devs []probe.Device
	if err := json.Unmarshal([]byte(devicesJSON), &devs); err != nil || len(devs) == 0 {
		v.Detail = fmt.Sprintf("simulated node, but %s holds no devices (%q)", probe.EnvSimDevices, devicesJSON)
		return v
	}
	v.Runtime["glibc"] = "the probe started: the image has the glibc loader and libc"
	if _, err := open(); err != nil {
		v.Runtime["libcuda"] = "not in the image, as expected: the GPU injection brings the node's"
	} else {
		// An image's own libcuda.so.1 (a compat or stub library) can
		// shadow the node's driver once it is injected: worth saying.
		v.Runtime["libcuda"] = "the image has a libcuda.so.1 of its own (not called: the node is simulated)"
	}
	ok := true
	for _, d := range devs {
		v.Devices = append(v.Devices, probe.Device{Index: d.Index, UUID: d.UUID, Name: d.Name, CC: d.CC,
			OK: &ok, Detail: "simulated: no saxpy run"})
	}
	v.SimulatedChecks = append([]string(nil), simulatedChecks...)
	v.OK = true
	v.Detail = fmt.Sprintf("simulated node: the cuda probe starts in this image; the driver work on %d GPUs is simulated (%s)",
		len(devs), strings.Join(simulatedChecks, "; "))
	return v
}
