package main

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// libName is the driver library the container gets from the GPU injection
// (a variable only so tests can name one that is absent, with -X).
var libName = "libcuda.so.1"

// cudaLib calls libcuda.so.1 through purego, so the probe builds with
// CGO_ENABLED=0 and needs nothing from the image but glibc. Symbols resolve
// on first use: a library lacking one fails that call, not the load.
type cudaLib struct {
	handle uintptr
	syms   map[string]uintptr
}

func openCUDA() (driver, error) {
	h, err := purego.Dlopen(libName, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoLibrary, err)
	}
	return &cudaLib{handle: h, syms: map[string]uintptr{}}, nil
}

func (c *cudaLib) sym(name string) (uintptr, error) {
	if p, ok := c.syms[name]; ok {
		return p, nil
	}
	p, err := purego.Dlsym(c.handle, name)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("%s has no %s (driver too old or not NVIDIA's): %v", libName, name, err)
	}
	c.syms[name] = p
	return p, nil
}

// call invokes a CUresult-returning function with integer/pointer arguments.
func (c *cudaLib) call(name string, args ...uintptr) error {
	fn, err := c.sym(name)
	if err != nil {
		return err
	}
	r, _, _ := purego.SyscallN(fn, args...)
	if code := int(int32(r)); code != 0 {
		return &cuError{Call: name, Code: code, Name: c.errorName(code)}
	}
	return nil
}

// errorName asks the driver (cuGetErrorName); "" lets cuError use its table.
func (c *cudaLib) errorName(code int) string {
	fn, err := c.sym("cuGetErrorName")
	if err != nil {
		return ""
	}
	var s *byte
	if r, _, _ := purego.SyscallN(fn, uintptr(code), ptr(&s)); r != 0 || s == nil {
		return ""
	}
	return cString(s, 128)
}

func cString(p *byte, max int) string {
	b := unsafe.Slice(p, max)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func ptr[T any](p *T) uintptr {
	escape(p)
	return uintptr(unsafe.Pointer(p))
}

// escape makes what it is given live on the heap. A pointer turned into a
// uintptr before a call is invisible to the stack mover: were the variable
// on the goroutine's stack, a stack growth between here and the C call
// would leave the driver writing to the old copy. Heap objects never move.
//
//go:noinline
func escape(p any) {
	if escapeNever {
		escapeSink = p
	}
}

var (
	escapeNever bool
	//lint:ignore U1000 written, never read: storing p here is what makes it escape to the heap.
	escapeSink any
)

func (c *cudaLib) Init() error { return c.call("cuInit", 0) }

func (c *cudaLib) DriverVersion() (int, error) {
	var v int32
	err := c.call("cuDriverGetVersion", ptr(&v))
	return int(v), err
}

func (c *cudaLib) DeviceCount() (int, error) {
	var n int32
	err := c.call("cuDeviceGetCount", ptr(&n))
	return int(n), err
}

func (c *cudaLib) Device(ordinal int) (int, error) {
	var d int32
	err := c.call("cuDeviceGet", ptr(&d), uintptr(ordinal))
	return int(d), err
}

func (c *cudaLib) Name(dev int) (string, error) {
	var buf [256]byte
	if err := c.call("cuDeviceGetName", ptr(&buf[0]), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return cString(&buf[0], len(buf)), nil
}

func (c *cudaLib) UUID(dev int) ([16]byte, error) {
	var u [16]byte
	// _v2 gives MIG instances their own UUID; older drivers have only the first.
	name := "cuDeviceGetUuid_v2"
	if _, err := c.sym(name); err != nil {
		name = "cuDeviceGetUuid"
	}
	err := c.call(name, ptr(&u[0]), uintptr(dev))
	return u, err
}

func (c *cudaLib) Attribute(attr, dev int) (int, error) {
	var v int32
	err := c.call("cuDeviceGetAttribute", ptr(&v), uintptr(attr), uintptr(dev))
	return int(v), err
}

func (c *cudaLib) PrimaryContext(dev int) (func(), error) {
	var ctx uintptr
	if err := c.call("cuDevicePrimaryCtxRetain", ptr(&ctx), uintptr(dev)); err != nil {
		return nil, err
	}
	release := func() {
		_ = c.call("cuCtxSetCurrent", 0)
		if c.call("cuDevicePrimaryCtxRelease_v2", uintptr(dev)) != nil {
			_ = c.call("cuDevicePrimaryCtxRelease", uintptr(dev))
		}
	}
	if err := c.call("cuCtxSetCurrent", ctx); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// JIT options of cuModuleLoadDataEx (CUjit_option).
const (
	jitErrorLogBuffer     = 5 // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSize = 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
)

// ModuleLoad JIT-compiles the PTX. With cuModuleLoadDataEx it also asks for
// the JIT's error log, which says why a driver rejected the PTX.
func (c *cudaLib) ModuleLoad(image []byte) (uintptr, error) {
	var mod uintptr
	defer runtime.KeepAlive(image)
	if _, err := c.sym("cuModuleLoadDataEx"); err != nil {
		return mod, c.call("cuModuleLoadData", ptr(&mod), ptr(&image[0]))
	}
	log := make([]byte, 4096)
	opts := [2]int32{jitErrorLogBuffer, jitErrorLogBufferSize}
	vals := [2]uintptr{ptr(&log[0]), uintptr(len(log))}
	var pin runtime.Pinner
	pin.Pin(&log[0])
	defer pin.Unpin()
	err := c.call("cuModuleLoadDataEx", ptr(&mod), ptr(&image[0]), uintptr(len(opts)), ptr(&opts[0]), ptr(&vals[0]))
	if err != nil {
		if msg := strings.TrimSpace(cString(&log[0], len(log))); msg != "" {
			return mod, fmt.Errorf("%w; JIT log: %s", err, strings.Join(strings.Fields(msg), " "))
		}
	}
	return mod, err
}

func (c *cudaLib) ModuleUnload(mod uintptr) error { return c.call("cuModuleUnload", mod) }

func (c *cudaLib) Function(mod uintptr, name string) (uintptr, error) {
	var fn uintptr
	cname := append([]byte(name), 0)
	err := c.call("cuModuleGetFunction", ptr(&fn), mod, ptr(&cname[0]))
	runtime.KeepAlive(cname)
	return fn, err
}

func (c *cudaLib) MemAlloc(bytes int) (uintptr, error) {
	var p uint64 // CUdeviceptr
	err := c.call("cuMemAlloc_v2", ptr(&p), uintptr(bytes))
	return uintptr(p), err
}

func (c *cudaLib) MemFree(p uintptr) error { return c.call("cuMemFree_v2", p) }

func (c *cudaLib) HtoD(dst uintptr, src []byte) error {
	err := c.call("cuMemcpyHtoD_v2", dst, ptr(&src[0]), uintptr(len(src)))
	runtime.KeepAlive(src)
	return err
}

func (c *cudaLib) DtoH(dst []byte, src uintptr) error {
	err := c.call("cuMemcpyDtoH_v2", ptr(&dst[0]), src, uintptr(len(dst)))
	runtime.KeepAlive(dst)
	return err
}

// saxpyParams holds the kernel's arguments; cuLaunchKernel reads each
// through a pointer in an array, so both live pinned for the call.
type saxpyParams struct {
	n         uint32
	a         float32
	x, y, out uint64
	ptrs      [5]unsafe.Pointer
}

func (c *cudaLib) LaunchSaxpy(fn uintptr, grid, block uint32, n uint32, a float32, x, y, out uintptr) error {
	p := &saxpyParams{n: n, a: a, x: uint64(x), y: uint64(y), out: uint64(out)}
	p.ptrs = [5]unsafe.Pointer{unsafe.Pointer(&p.n), unsafe.Pointer(&p.a), unsafe.Pointer(&p.x), unsafe.Pointer(&p.y), unsafe.Pointer(&p.out)}
	var pin runtime.Pinner
	pin.Pin(p)
	defer pin.Unpin()
	// cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMem, stream, params, extra)
	return c.call("cuLaunchKernel", fn,
		uintptr(grid), 1, 1, uintptr(block), 1, 1,
		0, 0, ptr(&p.ptrs[0]), 0)
}

func (c *cudaLib) Synchronize() error { return c.call("cuCtxSynchronize") }
