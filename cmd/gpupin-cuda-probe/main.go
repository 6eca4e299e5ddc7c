// Command gpupin-cuda-probe proves that the CUDA driver computes on every
// visible GPU: it loads libcuda.so.1 at run time (purego, no cgo), JIT-loads a
// PTX saxpy kernel on each device, checks every element and prints one
// "GPUPIN-PROBE {json}" line. gpupin bind-mounts it into any glibc image; the
// image needs no CUDA toolkit, since the driver library comes with the GPU
// injection. It exits 0 only when every device passed.
//
// With GPUPIN_SIMULATED=1 (a node without a GPU) it only proves that it
// starts in the image and reports the driver work as simulated.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/gpupin/gpupin/probe"
)

func init() {
	// A CUDA context is current per OS thread: keep every driver call on one.
	runtime.LockOSThread()
}

func main() {
	var v *probe.Verdict
	if os.Getenv(probe.EnvSimulated) == "1" {
		v = runSimulated(openCUDA, os.Getenv(probe.EnvSimDevices))
	} else {
		v = run(openCUDA)
	}
	if err := emit(os.Stdout, v); err != nil {
		fmt.Fprintln(os.Stderr, "gpupin-cuda-probe:", err)
		os.Exit(1)
	}
	if !v.OK {
		os.Exit(1)
	}
}

func emit(w io.Writer, v *probe.Verdict) error {
	js, err := json.Marshal(v)
	if err != nil {
		js, _ = json.Marshal(probe.Verdict{Devices: []probe.Device{}, Detail: "cannot encode verdict: " + err.Error()})
		v.OK = false
	}
	_, err = fmt.Fprintf(w, "%s%s\n", probe.LinePrefix, js)
	return err
}
