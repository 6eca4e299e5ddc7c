package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpupin/gpupin/probe"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// buildProbe builds the probe as shipped (CGO_ENABLED=0), and, with
// hostHasDriver, a copy that looks for a library name no host has, so the
// no-library case is tested on GPU machines too.
func buildProbe(t *testing.T) (bin, absentBin string) {
	t.Helper()
	skipShort(t)
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gpupin-cuda-probe-test-")
		if buildErr != nil {
			return
		}
		for name, ldflags := range map[string]string{
			"gpupin-cuda-probe": "",
			"absent":            "-X main.libName=libcuda-gpupin-absent.so.1",
		} {
			cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", filepath.Join(binDir, name), ".")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = errors.New("go build: " + err.Error() + "\n" + string(out))
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "gpupin-cuda-probe"), filepath.Join(binDir, "absent")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// fakeLib compiles testdata/fakecuda.c into dir/libcuda.so.1.
func fakeLib(t *testing.T, defines ...string) string {
	t.Helper()
	skipShort(t)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc is needed to build the stand-in libcuda.so.1: %v", err)
	}
	dir := t.TempDir()
	args := append([]string{"-Wall", "-Werror", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1")}, defines...)
	if out, err := exec.Command(gcc, append(args, "testdata/fakecuda.c")...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return dir
}

func runBinary(t *testing.T, bin string, env ...string) ([]byte, int) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ee.ExitCode() < 0 {
			t.Fatalf("probe died (%v); output:\n%s", err, out.Bytes())
		}
		return out.Bytes(), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.Bytes(), 0
}

func hostHasDriver() bool {
	out, _ := exec.Command("/sbin/ldconfig", "-p").Output()
	return bytes.Contains(out, []byte("libcuda.so.1"))
}

func TestBinaryWithoutDriver(t *testing.T) {
	bin, absent := buildProbe(t)
	if hostHasDriver() {
		bin = absent
	}
	out, code := runBinary(t, bin, "LD_LIBRARY_PATH=")
	if code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out)
	}
	v, err := probe.Parse(out, code)
	if v == nil || err == nil || !strings.Contains(v.Detail, "no CUDA driver library") {
		t.Fatalf("verdict %+v, err %v; want a failed verdict saying no CUDA driver library", v, err)
	}
}

func TestBinaryIsBuiltWithoutCgo(t *testing.T) {
	bin, _ := buildProbe(t)
	// Without cgo the binary needs only the dynamic loader and glibc's
	// libc/libdl/libpthread, so it runs in any glibc image.
	out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "CGO_ENABLED=0") {
		t.Fatalf("probe not built with CGO_ENABLED=0:\n%s", out)
	}
}

func TestBinaryWithStandInDriver(t *testing.T) {
	bin, _ := buildProbe(t)
	lib := fakeLib(t)
	tests := []struct {
		mode       string
		noLoadEx   bool // the library lacks cuModuleLoadDataEx
		oldUUID    bool // the library has cuDeviceGetUuid, not _v2
		wantExit   int
		wantDetail string // in the verdict's detail or a device's
		wantOK     bool
	}{
		{mode: "init100", wantExit: 1, wantDetail: "cuInit: CUDA_ERROR_NO_DEVICE (100)"},
		{mode: "zero", wantExit: 1, wantDetail: "no CUDA devices"},
		{mode: "ok", wantOK: true, wantDetail: "2 GPUs passed"},
		{mode: "corrupt", wantExit: 1, wantDetail: "GPU 1: saxpy: 1 of 1048576 elements wrong (first at 12345: got 417.25, want 416.25)"},
		// The library has no name for 218: the probe's own table names it.
		{mode: "badptx", wantExit: 1, wantDetail: "GPU 1: load the PTX kernel: cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX (218); JIT log: ptxas fatal : Unsupported .version 5.0"},
		{mode: "badptx", noLoadEx: true, wantExit: 1, wantDetail: "GPU 1: load the PTX kernel: cuModuleLoadData: CUDA_ERROR_INVALID_PTX (218)"},
		{mode: "ok", noLoadEx: true, wantOK: true, wantDetail: "2 GPUs passed"},
		// A device whose UUID cannot be read fails: gpupin matches GPUs by it.
		{mode: "nouuid", wantExit: 1, wantDetail: "GPU 1: read its UUID: cuDeviceGetUuid_v2: CUDA_ERROR_NOT_SUPPORTED (801)"},
		{mode: "ok", oldUUID: true, wantOK: true, wantDetail: "2 GPUs passed"},
		{mode: "nouuid", oldUUID: true, wantExit: 1, wantDetail: "GPU 1: read its UUID: cuDeviceGetUuid: CUDA_ERROR_NOT_SUPPORTED (801)"},
	}
	oldLib := fakeLib(t, "-DNO_LOAD_EX")
	oldUUIDLib := fakeLib(t, "-DOLD_UUID")
	for _, tt := range tests {
		name := tt.mode
		if tt.noLoadEx {
			name += "/without cuModuleLoadDataEx"
		}
		if tt.oldUUID {
			name += "/without cuDeviceGetUuid_v2"
		}
		t.Run(name, func(t *testing.T) {
			l := lib
			if tt.noLoadEx {
				l = oldLib
			}
			if tt.oldUUID {
				l = oldUUIDLib
			}
			out, code := runBinary(t, bin, "LD_LIBRARY_PATH="+l, "GPUPIN_FAKE_CUDA="+tt.mode)
			if code != tt.wantExit {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tt.wantExit, out)
			}
			v, err := probe.Parse(out, code)
			if tt.wantOK {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if len(v.Devices) != 2 || v.Devices[0].UUID != "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f" ||
					v.Devices[1].Name != "Fake L4" || v.Devices[1].CC != "8.9" || v.Runtime["driver_cuda"] != "12.9" {
					t.Fatalf("verdict = %+v", v)
				}
				if !strings.Contains(v.Detail, tt.wantDetail) {
					t.Fatalf("detail %q, want %q", v.Detail, tt.wantDetail)
				}
				return
			}
			if v == nil || err == nil {
				t.Fatalf("Parse = %+v, %v; want a failed verdict", v, err)
			}
			if !strings.Contains(err.Error(), tt.wantDetail) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.wantDetail)
			}
		})
	}
}

func TestBinaryWithForeignLibrary(t *testing.T) {
	bin, _ := buildProbe(t)
	lib := fakeLib(t, "-DONLY_INIT")
	out, code := runBinary(t, bin, "LD_LIBRARY_PATH="+lib)
	v, err := probe.Parse(out, code)
	if code != 1 || v == nil || !strings.Contains(err.Error(), "cannot count CUDA devices: libcuda.so.1 has no cuDeviceGetCount") {
		t.Fatalf("exit %d, verdict %+v, err %v; want a failed verdict naming the missing symbol", code, v, err)
	}
}

// skipShort: building the probe and the stand-in libcuda takes the go and
// gcc toolchains' time; the fast tier (-short) does neither.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: builds the probe or a stand-in libcuda (make test runs it)")
	}
}
