package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/probe"
)

// fakeDriver is an in-process driver: device memory is Go memory and the
// kernel runs in Go. Each field injects one fault.
type fakeDriver struct {
	initErr, countErr error
	count             int
	loadErr           map[int]error // by device
	uuidErr           map[int]error // by device
	corrupt           map[int]bool  // the kernel writes one wrong element
	noWrite           map[int]bool  // the kernel writes nothing
	panicOn           string        // method name that panics

	cur     int
	mem     map[uintptr][]byte
	next    uintptr
	retains int
}

func (f *fakeDriver) maybePanic(m string) {
	if f.panicOn == m {
		panic("fake driver: " + m)
	}
}

func (f *fakeDriver) Init() error                 { f.maybePanic("Init"); return f.initErr }
func (f *fakeDriver) DriverVersion() (int, error) { return 13000, nil }
func (f *fakeDriver) DeviceCount() (int, error)   { return f.count, f.countErr }
func (f *fakeDriver) Device(i int) (int, error)   { return i, nil }
func (f *fakeDriver) Name(dev int) (string, error) {
	return "Fake GPU", nil
}
func (f *fakeDriver) UUID(dev int) ([16]byte, error) { return [16]byte{byte(dev), 1}, f.uuidErr[dev] }
func (f *fakeDriver) Attribute(attr, dev int) (int, error) {
	if attr == attrCCMajor {
		return 12, nil
	}
	return 0, nil
}
func (f *fakeDriver) PrimaryContext(dev int) (func(), error) {
	f.maybePanic("PrimaryContext")
	f.cur = dev
	f.retains++
	return func() { f.retains-- }, nil
}
func (f *fakeDriver) ModuleLoad(image []byte) (uintptr, error) {
	if image[len(image)-1] != 0 {
		return 0, &cuError{Call: "cuModuleLoadData", Code: 218}
	}
	return 1, f.loadErr[f.cur]
}
func (f *fakeDriver) ModuleUnload(uintptr) error { return nil }
func (f *fakeDriver) Function(mod uintptr, name string) (uintptr, error) {
	if name != kernelName {
		return 0, &cuError{Call: "cuModuleGetFunction", Code: 500}
	}
	return 2, nil
}
func (f *fakeDriver) MemAlloc(n int) (uintptr, error) {
	if f.mem == nil {
		f.mem, f.next = map[uintptr][]byte{}, 0x1000
	}
	f.next += 0x1000
	f.mem[f.next] = make([]byte, n)
	return f.next, nil
}
func (f *fakeDriver) MemFree(p uintptr) error        { delete(f.mem, p); return nil }
func (f *fakeDriver) HtoD(d uintptr, s []byte) error { copy(f.mem[d], s); return nil }
func (f *fakeDriver) DtoH(d []byte, s uintptr) error { copy(d, f.mem[s]); return nil }
func (f *fakeDriver) Synchronize() error             { return nil }

func (f *fakeDriver) LaunchSaxpy(fn uintptr, grid, block uint32, n uint32, a float32, x, y, out uintptr) error {
	if uint64(grid)*uint64(block) < uint64(n) {
		return errors.New("grid too small")
	}
	if f.noWrite[f.cur] {
		return nil
	}
	get := func(b []byte, i uint32) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
	for i := uint32(0); i < n; i++ {
		v := a*get(f.mem[x], i) + get(f.mem[y], i)
		if f.corrupt[f.cur] && i == 77 {
			v += 0.5
		}
		binary.LittleEndian.PutUint32(f.mem[out][4*i:], math.Float32bits(v))
	}
	return nil
}

func TestRun(t *testing.T) {
	noLib := func() (driver, error) { return nil, errNoLibrary }
	tests := []struct {
		name       string
		open       func() (driver, error)
		f          *fakeDriver
		wantErr    string // "" = Parse accepts the verdict
		wantFailed []int
	}{
		{name: "pass", f: &fakeDriver{count: 2}},
		{name: "no library", open: noLib, wantErr: "no CUDA driver library"},
		{name: "cuInit fails", f: &fakeDriver{initErr: &cuError{Call: "cuInit", Code: 999}}, wantErr: "cuInit: CUDA_ERROR_UNKNOWN (999)"},
		{name: "count fails", f: &fakeDriver{countErr: &cuError{Call: "cuDeviceGetCount", Code: 3}}, wantErr: "CUDA_ERROR_NOT_INITIALIZED (3)"},
		{name: "no devices", f: &fakeDriver{}, wantErr: "no CUDA devices"},
		{name: "PTX rejected on one device", f: &fakeDriver{count: 2, loadErr: map[int]error{1: &cuError{Call: "cuModuleLoadData", Code: 222}}},
			wantErr: "GPU 1: load the PTX kernel: cuModuleLoadData: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)", wantFailed: []int{1}},
		{name: "wrong element", f: &fakeDriver{count: 3, corrupt: map[int]bool{2: true}},
			wantErr: "GPU 2: saxpy: 1 of 1048576 elements wrong (first at 77", wantFailed: []int{2}},
		{name: "kernel writes nothing", f: &fakeDriver{count: 1, noWrite: map[int]bool{0: true}},
			wantErr: "1048576 of 1048576 elements wrong", wantFailed: []int{0}},
		{name: "UUID unreadable on one device", f: &fakeDriver{count: 2, uuidErr: map[int]error{1: &cuError{Call: "cuDeviceGetUuid_v2", Code: 801}}},
			wantErr: "GPU 1: read its UUID: cuDeviceGetUuid_v2: CUDA_ERROR_NOT_SUPPORTED (801)", wantFailed: []int{1}},
		{name: "panic in init", f: &fakeDriver{count: 1, panicOn: "Init"}, wantErr: "probe crashed: fake driver: Init"},
		{name: "panic on a device", f: &fakeDriver{count: 2, panicOn: "PrimaryContext"}, wantErr: "probe crashed: fake driver: PrimaryContext", wantFailed: []int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			open := tt.open
			if open == nil {
				open = func() (driver, error) { return tt.f, nil }
			}
			v := run(open)
			var buf bytes.Buffer
			if err := emit(&buf, v); err != nil {
				t.Fatal(err)
			}
			exit := 0
			if !v.OK {
				exit = 1
			}
			pv, err := probe.Parse(buf.Bytes(), exit)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if len(pv.Devices) != tt.f.count || pv.Devices[1].CC != "12.0" || pv.Runtime["driver_cuda"] != "13.0" {
					t.Fatalf("verdict = %+v", pv)
				}
				if tt.f.retains != 0 || len(tt.f.mem) != 0 {
					t.Fatalf("leaked %d contexts, %d buffers", tt.f.retains, len(tt.f.mem))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Parse error = %v\nwant it to contain %q", err, tt.wantErr)
			}
			var failed []int
			for _, d := range v.Devices {
				if !*d.OK {
					failed = append(failed, d.Index)
				}
			}
			if len(failed) != len(tt.wantFailed) {
				t.Fatalf("failed devices %v, want %v", failed, tt.wantFailed)
			}
		})
	}
}

func TestErrorName(t *testing.T) {
	tests := []struct {
		err  *cuError
		want string
	}{
		{&cuError{Call: "cuInit", Code: 100}, "cuInit: CUDA_ERROR_NO_DEVICE (100)"},
		{&cuError{Call: "cuInit", Code: 100, Name: "FROM_DRIVER"}, "cuInit: FROM_DRIVER (100)"},
		{&cuError{Call: "cuX", Code: 12345}, "cuX: CUDA_ERROR_UNKNOWN_CODE (12345)"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	if got, want := formatUUID(u), "GPU-deadbeef-0102-0304-0506-0708090a0b0c"; got != want {
		t.Fatalf("formatUUID = %q, want %q", got, want)
	}
}

func TestPTXIsNulTerminated(t *testing.T) {
	if saxpyPTX[len(saxpyPTX)-1] != 0 || bytes.Count(saxpyPTX, []byte{0}) != 1 {
		t.Fatal("cuModuleLoadData needs exactly one NUL, at the end")
	}
	for _, want := range []string{".version 5.0", ".target sm_50", ".entry " + kernelName + "("} {
		if !bytes.Contains(saxpyPTX, []byte(want)) {
			t.Errorf("PTX lacks %q", want)
		}
	}
}
