package main

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gpupin/gpupin/probe"
)

// saxpyPTX is the kernel, NUL-terminated as cuModuleLoadData wants.
//
//go:embed saxpy.ptx
var saxpyText string

var saxpyPTX = append([]byte(saxpyText), 0)

const (
	kernelName = "gpupin_saxpy"
	elements   = 1 << 20
	blockSize  = 256
	// timedIters launches make the timed run a few milliseconds even on fast GPUs.
	timedIters = 20
	saxpyA     = float32(2.5)

	attrCCMajor = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrCCMinor = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
)

// driver is the part of the CUDA driver API the probe uses. cudaLib
// implements it over libcuda.so.1; tests substitute fakes.
type driver interface {
	Init() error
	DriverVersion() (int, error)
	DeviceCount() (int, error)
	Device(ordinal int) (int, error)
	Name(dev int) (string, error)
	UUID(dev int) ([16]byte, error)
	Attribute(attr, dev int) (int, error)
	// PrimaryContext retains dev's primary context and makes it current; release undoes both.
	PrimaryContext(dev int) (release func(), err error)
	ModuleLoad(image []byte) (module uintptr, err error)
	ModuleUnload(module uintptr) error
	Function(module uintptr, name string) (uintptr, error)
	MemAlloc(bytes int) (uintptr, error)
	MemFree(ptr uintptr) error
	HtoD(dst uintptr, src []byte) error
	DtoH(dst []byte, src uintptr) error
	LaunchSaxpy(fn uintptr, grid, block uint32, n uint32, a float32, x, y, out uintptr) error
	Synchronize() error
}

// cuError is a failed driver call.
type cuError struct {
	Call string
	Code int
	Name string // CUDA_ERROR_…; from cuGetErrorName when the library has it
}

func (e *cuError) Error() string {
	name := e.Name
	if name == "" {
		name = errorName(e.Code)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, name, e.Code)
}

// errNoLibrary wraps a failed dlopen of libcuda.so.1.
var errNoLibrary = errors.New("no CUDA driver library (libcuda.so.1); the node's driver was not injected into the container (CDI devices or the nvidia runtime)")

// run probes every device and returns the verdict; it never panics.
func run(open func() (driver, error)) (v *probe.Verdict) {
	v = &probe.Verdict{Devices: []probe.Device{}, Runtime: map[string]any{"probe": "cuda"}}
	defer func() {
		if r := recover(); r != nil {
			v.OK = false
			v.Detail = fmt.Sprintf("probe crashed: %v", r)
		}
	}()

	d, err := open()
	if err != nil {
		v.Detail = err.Error()
		return v
	}
	if err := d.Init(); err != nil {
		v.Detail = "cannot initialise the CUDA driver: " + err.Error()
		return v
	}
	if ver, err := d.DriverVersion(); err == nil {
		v.Runtime["driver_cuda"] = fmt.Sprintf("%d.%d", ver/1000, ver%1000/10)
	}
	n, err := d.DeviceCount()
	if err != nil {
		v.Detail = "cannot count CUDA devices: " + err.Error()
		return v
	}
	if n == 0 {
		v.Detail = "no CUDA devices"
		return v
	}
	v.Runtime["kernel"] = fmt.Sprintf("saxpy PTX (sm_50, JIT), %d elements, %d timed launches", elements, timedIters)

	failed := 0
	for i := 0; i < n; i++ {
		dev := probeDevice(d, i)
		if !*dev.OK {
			failed++
		}
		v.Devices = append(v.Devices, dev)
	}
	v.OK = failed == 0
	if v.OK {
		v.Detail = fmt.Sprintf("%d GPUs passed", n)
	} else {
		v.Detail = fmt.Sprintf("%d of %d GPUs failed", failed, n)
	}
	return v
}

// probeDevice runs saxpy on device i and checks every element.
func probeDevice(d driver, i int) (dev probe.Device) {
	dev = probe.Device{Index: i}
	fail := func(err error) probe.Device {
		f := false
		dev.OK, dev.Detail = &f, err.Error()
		return dev
	}
	defer func() {
		if r := recover(); r != nil {
			dev = fail(fmt.Errorf("probe crashed: %v", r))
		}
	}()

	h, err := d.Device(i)
	if err != nil {
		return fail(err)
	}
	if name, err := d.Name(h); err == nil {
		dev.Name = name
	}
	// gpupin matches the GPUs a probe computed on to the node's by UUID: a
	// device the probe cannot name fails rather than go unnamed.
	u, err := d.UUID(h)
	if err != nil {
		return fail(fmt.Errorf("read its UUID: %w", err))
	}
	dev.UUID = formatUUID(u)
	major, err1 := d.Attribute(attrCCMajor, h)
	minor, err2 := d.Attribute(attrCCMinor, h)
	if err := errors.Join(err1, err2); err != nil {
		return fail(err)
	}
	dev.CC = fmt.Sprintf("%d.%d", major, minor)

	release, err := d.PrimaryContext(h)
	if err != nil {
		return fail(err)
	}
	defer release()
	mod, err := d.ModuleLoad(saxpyPTX)
	if err != nil {
		return fail(fmt.Errorf("load the PTX kernel: %w", err))
	}
	defer d.ModuleUnload(mod)
	fn, err := d.Function(mod, kernelName)
	if err != nil {
		return fail(err)
	}

	x, y, out := make([]float32, elements), make([]float32, elements), make([]float32, elements)
	for j := range x {
		// Inputs whose a*x+y is exact in float32, so any difference is a fault.
		x[j] = float32(j%4096) * 0.5
		y[j] = float32(j % 1000)
		out[j] = float32(math.NaN()) // a kernel that writes nothing must not pass
	}
	const size = elements * 4
	var bufs [3]uintptr
	for k := range bufs {
		if bufs[k], err = d.MemAlloc(size); err != nil {
			return fail(err)
		}
		defer d.MemFree(bufs[k])
	}
	for k, s := range [][]float32{x, y, out} {
		if err := d.HtoD(bufs[k], floatBytes(s)); err != nil {
			return fail(err)
		}
	}

	grid := uint32((elements + blockSize - 1) / blockSize)
	launch := func() error {
		return d.LaunchSaxpy(fn, grid, blockSize, elements, saxpyA, bufs[0], bufs[1], bufs[2])
	}
	// The first launch is checked alone; later ones are timed.
	if err := launch(); err != nil {
		return fail(err)
	}
	if err := d.Synchronize(); err != nil {
		return fail(err)
	}
	if err := d.DtoH(floatBytes(out), bufs[2]); err != nil {
		return fail(err)
	}
	bad, first, maxErr := check(x, y, out)
	dev.MaxAbsErr = maxErr
	if math.IsInf(maxErr, 0) || math.IsNaN(maxErr) {
		dev.MaxAbsErr = -1 // JSON cannot carry NaN; the detail says what happened
	}
	if bad > 0 {
		return fail(fmt.Errorf("saxpy: %d of %d elements wrong (first at %d: got %v, want %v)",
			bad, elements, first, out[first], saxpyA*x[first]+y[first]))
	}

	start := time.Now()
	for k := 0; k < timedIters; k++ {
		if err := launch(); err != nil {
			return fail(err)
		}
	}
	if err := d.Synchronize(); err != nil {
		return fail(err)
	}
	secs := time.Since(start).Seconds()
	if secs > 0 {
		dev.TFLOPS = 2 * elements * timedIters / secs / 1e12
		gbps := 12 * elements * timedIters / secs / 1e9
		dev.Detail = fmt.Sprintf("saxpy: %d elements correct, %.0f GB/s", elements, gbps)
	}
	ok := true
	dev.OK = &ok
	return dev
}

// check compares out with a*x+y and returns the wrong count, the first wrong
// index and the largest absolute difference.
func check(x, y, out []float32) (bad, first int, maxErr float64) {
	first = -1
	for j := range out {
		want := saxpyA*x[j] + y[j]
		if out[j] == want {
			continue
		}
		if bad == 0 {
			first = j
		}
		bad++
		diff := math.Abs(float64(out[j]) - float64(want))
		if math.IsNaN(diff) {
			diff = math.Inf(1)
		}
		maxErr = math.Max(maxErr, diff)
	}
	return bad, first, maxErr
}

func floatBytes(s []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*4)
}

func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// errorName names CUresult codes for libraries without cuGetErrorName.
func errorName(code int) string {
	if n, ok := cuResultNames[code]; ok {
		return n
	}
	return "CUDA_ERROR_UNKNOWN_CODE"
}

var cuResultNames = map[int]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	218: "CUDA_ERROR_INVALID_PTX",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	400: "CUDA_ERROR_INVALID_HANDLE",
	500: "CUDA_ERROR_NOT_FOUND",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	999: "CUDA_ERROR_UNKNOWN",
}
