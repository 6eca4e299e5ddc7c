package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupin/gpupin/probe"
)

var simDevices = []probe.Device{
	{Index: 0, UUID: "GPU-sim-0", Name: "Simulated H200", CC: "9.0"},
	{Index: 1, UUID: "GPU-sim-1", Name: "Simulated H200", CC: "9.0"},
}

// env is the probe's environment: what gpupin passes for the simulated
// node (devices, node CUDA) and what the image sets.
func env(t *testing.T, nodeCUDA string, image ...string) func(string) string {
	t.Helper()
	js, err := json.Marshal(simDevices)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{probe.EnvSimDevices: string(js), probe.EnvSimNodeCUDA: nodeCUDA, probe.EnvSimulated: "1"}
	for _, kv := range image {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

func TestSimProbeSimulatedNodeVersions(t *testing.T) {
	tests := []struct {
		node, image string
		wantOK      bool
	}{
		{"13", "12.9.1", true},
		{"13", "13.0", true},
		{"13", "13.1", false},
		{"12.9.1", "12.9", true},
		{"12.9", "13", false},
		{"12.10", "12.9", true},
		{"", "99.0", true}, // no node version: no check
	}
	for _, tt := range tests {
		var out bytes.Buffer
		code := run(&out, env(t, tt.node, "CUDA_VERSION="+tt.image))
		_, err := probe.Parse(out.Bytes(), code)
		if (err == nil) != tt.wantOK {
			t.Errorf("node %q, image %q: Parse error %v, want ok=%v", tt.node, tt.image, err, tt.wantOK)
		}
	}
}

func TestSimProbeSimulatedModes(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		wantExit int
		wantErr  string // "" = passes
		wantV    bool   // Parse returns a verdict with the error
		minOut   int
	}{
		{name: "pass", env: []string{"CUDA_VERSION=12.9.1"}},
		{name: "emulate", env: []string{"CUDA_VERSION=12.9.1", "GPUPIN_SIM_PROBE=emulate"}},
		{name: "pass older image", env: []string{"CUDA_VERSION=12.4"}},
		{name: "pass without CUDA_VERSION"},
		{name: "pass with malformed CUDA_VERSION", env: []string{`CUDA_VERSION=13"}`}},
		{name: "image newer major", env: []string{"CUDA_VERSION=13.0.1", "GPUPIN_SIM_PROBE=emulate"}, wantExit: 1, wantV: true,
			wantErr: "CUDA driver version is insufficient for CUDA runtime version (simulated: image CUDA 13.0.1, node supports 12.9)"},
		{name: "image newer minor", env: []string{"CUDA_VERSION=12.10"}, wantExit: 1, wantV: true, wantErr: "node supports 12.9"},
		{name: "fail", env: []string{"GPUPIN_SIM_PROBE=fail"}, wantExit: 1, wantV: true, wantErr: "simulated failure: GPUPIN_SIM_PROBE=fail"},
		{name: "unknown mode", env: []string{`GPUPIN_SIM_PROBE=x"y`}, wantExit: 1, wantV: true, wantErr: "unknown GPUPIN_SIM_PROBE=(unprintable)"},
		{name: "garbled", env: []string{"GPUPIN_SIM_PROBE=garbled"}, wantErr: "garbled verdict line"},
		{name: "noline", env: []string{"GPUPIN_SIM_PROBE=noline"}, wantErr: `no "GPUPIN-PROBE" line`},
		{name: "exit1", env: []string{"GPUPIN_SIM_PROBE=exit1"}, wantExit: 1, wantV: true, wantErr: "verdict says ok but the probe exited with code 1"},
		{name: "big", env: []string{"GPUPIN_SIM_PROBE=big"}, minOut: 1 << 20},
		{name: "no devices", env: []string{probe.EnvSimDevices + "="}, wantExit: 1, wantV: true, wantErr: "no simulated devices"},
		{name: "devices not JSON", env: []string{probe.EnvSimDevices + "=[{"}, wantExit: 1, wantV: true, wantErr: "is not a JSON array of devices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			code := run(&buf, env(t, "12.9", tt.env...))
			out := buf.Bytes()
			if code != tt.wantExit {
				t.Fatalf("exit code %d, want %d; output:\n%s", code, tt.wantExit, probe.Tail(out))
			}
			if len(out) < tt.minOut {
				t.Fatalf("output %d bytes, want at least %d", len(out), tt.minOut)
			}
			v, err := probe.Parse(out, code)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if len(v.Devices) != 2 || v.Devices[1].UUID != "GPU-sim-1" || v.Runtime["simulated"] != true || len(v.SimulatedChecks) != 1 {
					t.Fatalf("verdict = %+v", v)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Parse error = %v, want %q", err, tt.wantErr)
			}
			if (v != nil) != tt.wantV {
				t.Fatalf("verdict returned = %v, want %v", v != nil, tt.wantV)
			}
		})
	}
}

func TestSimProbeSimulatedDiagnostics(t *testing.T) {
	var buf bytes.Buffer
	if code := run(&buf, env(t, "12.9", "GPUPIN_CDI_TEST=injected-by-cdi")); code != 0 {
		t.Fatalf("exit %d:\n%s", code, buf.String())
	}
	diag := map[string]string{}
	verdictAt, lastDiag := -1, -1
	for i, l := range strings.Split(buf.String(), "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(l, "GPUPIN-SIM "), "="); ok && strings.HasPrefix(l, "GPUPIN-SIM ") {
			diag[k] = v
			lastDiag = i
		}
		if strings.HasPrefix(l, probe.LinePrefix) {
			verdictAt = i
		}
	}
	if verdictAt < lastDiag {
		t.Errorf("diagnostics (last at line %d) must come before the verdict (line %d)", lastDiag, verdictAt)
	}
	checks := map[string]*regexp.Regexp{
		"net":             regexp.MustCompile(`^[\w.@ -]*$`),
		"rootfs-writable": regexp.MustCompile(`^(yes|no)$`),
		"capeff":          regexp.MustCompile(`^[0-9a-f]{16}$`),
		"nonewprivs":      regexp.MustCompile(`^[01]$`),
		"uid":             regexp.MustCompile(`^[0-9]+$`),
		"env":             regexp.MustCompile(`^injected-by-cdi$`),
		"devices":         regexp.MustCompile(`^(/dev/gpupin-test\S*( |$))*$`),
	}
	for k, re := range checks {
		v, ok := diag[k]
		if !ok {
			t.Errorf("no GPUPIN-SIM %s= line", k)
		} else if !re.MatchString(v) {
			t.Errorf("GPUPIN-SIM %s=%q does not match %s", k, v, re)
		}
	}
	if _, err := os.Stat("/sys/class/net/lo"); err == nil && !strings.Contains(" "+diag["net"]+" ", " lo ") {
		t.Errorf("net=%q lacks lo", diag["net"])
	}
	if _, err := os.Stat("/.gpupin-rw-test"); err == nil {
		t.Error("the rootfs write test left /.gpupin-rw-test behind")
	}
}

// buildBinary builds the sim probe as the Makefile does.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: builds the binary (make test runs it)")
	}
	bin := filepath.Join(t.TempDir(), probe.SimProbeName)
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestSimProbeSimulatedBinaryIsStaticAndHangs checks the two things only
// the built binary shows: it needs no loader (so it runs in scratch and
// distroless images), and hang mode runs until it is killed.
func TestSimProbeSimulatedBinaryIsStaticAndHangs(t *testing.T) {
	bin := buildBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s asks for an ELF interpreter: it must be static (CGO_ENABLED=0, no cgo packages)", bin)
		}
	}
	f.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{probe.EnvSimProbe + "=hang", probe.EnvSimDevices + `=[{"index":0}]`}
	// Hang mode leaves a child, as a stuck probe would: kill the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A loaded machine may take a while to fork: wait for the child on a
	// generous clock, then give the probe time to exit if it were going to.
	children := 0
	for deadline := time.Now().Add(10 * time.Second); children == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		children = childCount(t, cmd.Process.Pid)
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("hang mode: wait: %v", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("hang mode exited by itself (%v), want it running until killed", err)
	}
	if children != 1 {
		t.Errorf("hang mode has %d child processes, want 1 (a stuck probe with a child)", children)
	}
}

// childCount counts pid's children. Each thread lists only the children
// it forked, and Go forks from whichever thread the goroutine is on, so
// every thread is read.
func childCount(t *testing.T, pid int) int {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		data, _ := os.ReadFile(f) // a thread may end while we read
		n += len(strings.Fields(string(data)))
	}
	return n
}
