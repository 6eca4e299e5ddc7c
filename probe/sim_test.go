package probe

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// shells returns the POSIX shells to run sim.sh under: busybox (what test
// images have) and the host's /bin/sh (dash on Debian), which keeps the
// script free of extensions either one tolerates.
func shells(t *testing.T) [][]string {
	t.Helper()
	var sh [][]string
	if p, err := exec.LookPath("busybox"); err == nil {
		sh = append(sh, []string{p, "sh"})
	}
	if _, err := os.Stat("/bin/sh"); err == nil {
		sh = append(sh, []string{"/bin/sh"})
	}
	if len(sh) == 0 {
		t.Fatal("no busybox and no /bin/sh to run the sim probe")
	}
	return sh
}

var simDevices = []Device{
	{Index: 0, UUID: "GPU-sim-0", Name: "Simulated H200", CC: "9.0"},
	{Index: 1, UUID: "GPU-sim-1", Name: "Simulated H200", CC: "9.0"},
}

// runSim builds the sim program and runs its script on the host, with the
// program's env plus imageEnv (what the image would set), like a container would.
func runSim(t *testing.T, shell []string, imageEnv []string, timeout time.Duration) (out []byte, code int, timedOut bool) {
	t.Helper()
	p, err := Build(Sim, Options{Dir: t.TempDir(), Sim: SimOptions{Devices: simDevices, NodeCUDA: "12.9"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell[0], append(shell[1:], p.Mounts[0].Source)...)
	cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH")}, imageEnv...), p.Env...)
	// The hang mode leaves a sleep child: kill the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return buf.Bytes(), -1, true
	case errors.As(err, &ee):
		return buf.Bytes(), ee.ExitCode(), false
	case err != nil:
		t.Fatalf("run sim: %v", err)
	}
	return buf.Bytes(), 0, false
}

func TestSimProbeNodeVersions(t *testing.T) {
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
	sh := shells(t)[0]
	for _, tt := range tests {
		p, err := Build(Sim, Options{Dir: t.TempDir(), Sim: SimOptions{Devices: simDevices, NodeCUDA: tt.node}})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(sh[0], append(sh[1:], p.Mounts[0].Source)...)
		cmd.Env = append([]string{"CUDA_VERSION=" + tt.image}, p.Env...)
		out, _ := cmd.CombinedOutput()
		code := cmd.ProcessState.ExitCode()
		_, err = Parse(out, code)
		if (err == nil) != tt.wantOK {
			t.Errorf("node %q, image %q: Parse error %v, want ok=%v", tt.node, tt.image, err, tt.wantOK)
		}
	}
}

func TestSimProbe(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		wantExit int
		wantErr  string // "" = passes
		wantV    bool   // Parse returns a verdict with the error
		minOut   int
	}{
		{name: "pass", env: []string{"CUDA_VERSION=12.9.1"}},
		{name: "pass older image", env: []string{"CUDA_VERSION=12.4"}},
		{name: "pass without CUDA_VERSION"},
		{name: "pass with malformed CUDA_VERSION", env: []string{`CUDA_VERSION=13"}`}},
		{name: "image newer major", env: []string{"CUDA_VERSION=13.0.1"}, wantExit: 1, wantV: true,
			wantErr: "CUDA driver version is insufficient for CUDA runtime version (simulated: image CUDA 13.0.1, node supports 12.9)"},
		{name: "image newer minor", env: []string{"CUDA_VERSION=12.10"}, wantExit: 1, wantV: true, wantErr: "node supports 12.9"},
		{name: "fail", env: []string{"GPUPIN_SIM_PROBE=fail"}, wantExit: 1, wantV: true, wantErr: "simulated failure: GPUPIN_SIM_PROBE=fail"},
		{name: "unknown mode", env: []string{`GPUPIN_SIM_PROBE=x"y`}, wantExit: 1, wantV: true, wantErr: "unknown GPUPIN_SIM_PROBE=(unprintable)"},
		{name: "garbled", env: []string{"GPUPIN_SIM_PROBE=garbled"}, wantErr: "garbled verdict line"},
		{name: "noline", env: []string{"GPUPIN_SIM_PROBE=noline"}, wantErr: `no "GPUPIN-PROBE" line`},
		{name: "exit1", env: []string{"GPUPIN_SIM_PROBE=exit1"}, wantExit: 1, wantV: true, wantErr: "verdict says ok but the probe exited with code 1"},
		{name: "big", env: []string{"GPUPIN_SIM_PROBE=big"}, minOut: 1 << 20},
	}
	for _, sh := range shells(t) {
		for _, tt := range tests {
			t.Run(sh[0]+"/"+tt.name, func(t *testing.T) {
				out, code, timedOut := runSim(t, sh, tt.env, 20*time.Second)
				if timedOut {
					t.Fatalf("timed out; output:\n%s", Tail(out))
				}
				if code != tt.wantExit {
					t.Fatalf("exit code %d, want %d; output:\n%s", code, tt.wantExit, Tail(out))
				}
				if len(out) < tt.minOut {
					t.Fatalf("output %d bytes, want at least %d", len(out), tt.minOut)
				}
				v, err := Parse(out, code)
				if tt.wantErr == "" {
					if err != nil {
						t.Fatalf("Parse: %v", err)
					}
					if len(v.Devices) != 2 || v.Devices[1].UUID != "GPU-sim-1" || v.Runtime["simulated"] != true {
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
}

func TestSimProbeHang(t *testing.T) {
	sh := shells(t)[0]
	start := time.Now()
	out, _, timedOut := runSim(t, sh, []string{"GPUPIN_SIM_PROBE=hang"}, 500*time.Millisecond)
	if !timedOut {
		t.Fatalf("hang mode exited after %v; output:\n%s", time.Since(start), out)
	}
	if _, err := Parse(out, -1); err == nil {
		t.Fatal("Parse accepted the output of a hung probe")
	}
}

func TestSimProbeDiagnostics(t *testing.T) {
	for _, sh := range shells(t) {
		t.Run(sh[0], func(t *testing.T) {
			out, code, _ := runSim(t, sh, []string{"GPUPIN_CDI_TEST=injected-by-cdi"}, 20*time.Second)
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			diag := map[string]string{}
			verdictAt, lastDiag := -1, -1
			for i, l := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(strings.TrimPrefix(l, "GPUPIN-SIM "), "="); ok && strings.HasPrefix(l, "GPUPIN-SIM ") {
					diag[k] = v
					lastDiag = i
				}
				if strings.HasPrefix(l, LinePrefix) {
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
		})
	}
}
