package probe

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimProbeModeAndImageCUDA(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		wantMode string
		wantCUDA string
	}{
		{name: "none", env: []string{"PATH=/bin"}},
		{name: "mode and CUDA", env: []string{"CUDA_VERSION=12.9.1", "GPUPIN_SIM_PROBE=fail"}, wantMode: "fail", wantCUDA: "12.9.1"},
		{name: "the last one wins, as in a process", env: []string{"GPUPIN_SIM_PROBE=fail", "GPUPIN_SIM_PROBE=emulate"}, wantMode: "emulate"},
		{name: "set but empty is unset", env: []string{"GPUPIN_SIM_PROBE="}},
		{name: "not a version", env: []string{`CUDA_VERSION=13"}`}},
		{name: "a prefix of the name is another variable", env: []string{"GPUPIN_SIM_PROBEX=fail", "CUDA_VERSIONS=12.9"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SimProbeMode(tt.env); got != tt.wantMode {
				t.Errorf("SimProbeMode = %q, want %q", got, tt.wantMode)
			}
			if got := ImageCUDA(tt.env); got != tt.wantCUDA {
				t.Errorf("ImageCUDA = %q, want %q", got, tt.wantCUDA)
			}
		})
	}
}

// TestBuildSimulatedImageCannotSwitchModes checks that the mode is gpupin's
// to say: a real node's probe is told GPUPIN_SIMULATED=0 after anything the
// image sets (containerd.Run puts the program's env over the image's).
func TestBuildSimulatedImageCannotSwitchModes(t *testing.T) {
	for _, k := range []Kind{Torch, Exec} {
		p, err := Build(k, Options{Dir: t.TempDir(), ExecArgv: []string{"/selftest"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := lookupEnv(append([]string{"GPUPIN_SIMULATED=1"}, p.Env...), EnvSimulated); got != "0" {
			t.Errorf("%s on a real node: GPUPIN_SIMULATED=%q, want 0", k, got)
		}
	}
}

func TestExplain(t *testing.T) {
	// A real dynamically linked binary, so the loader it names is read from it.
	bin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	bin, _ = filepath.EvalSymlinks(bin)
	cuda := Program{Kind: CUDA, Args: []string{"/.gpupin-probe/gpupin-cuda-probe"},
		Mounts: []Mount{{Source: bin, Destination: "/.gpupin-probe/gpupin-cuda-probe"}}}
	sim := Program{Kind: Sim, Args: []string{"/.gpupin-probe/gpupin-sim-probe"},
		Mounts: []Mount{{Source: bin, Destination: "/.gpupin-probe/gpupin-sim-probe"}}}
	torch := Program{Kind: Torch, Args: []string{"python3", "/.gpupin-probe/gpupin_probe.py"}}
	exe := Program{Kind: Exec, Args: []string{"/usr/bin/selftest"}}
	startErr := func(arg0 string) error {
		return errors.New(`create task x: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "` + arg0 + `": executable file not found in $PATH: unknown`)
	}
	tests := []struct {
		name   string
		prog   Program
		output string
		err    error
		want   string // "" = nothing to explain
	}{
		{name: "no loader for the cuda probe (runc's words)", prog: cuda, output: "exec /.gpupin-probe/gpupin-cuda-probe: no such file or directory\n",
			want: "this image has no glibc loader; the cuda probe needs glibc (gpupin-cuda-probe is linked against glibc and asks for /lib"},
		{name: "no loader, said by the start error", prog: cuda, err: errors.New(`exec: "/.gpupin-probe/gpupin-cuda-probe": no such file or directory`),
			want: "this image has no glibc loader; the cuda probe needs glibc"},
		{name: "a glibc without libdl", prog: cuda, output: "/.gpupin-probe/gpupin-cuda-probe: error while loading shared libraries: libdl.so.2: cannot open shared object file: No such file or directory\n",
			want: "this image's glibc is incomplete for the cuda probe: /.gpupin-probe/gpupin-cuda-probe: error while loading shared libraries: libdl.so.2"},
		{name: "the sim probe not static", prog: sim, output: "exec /.gpupin-probe/gpupin-sim-probe: no such file or directory\n",
			want: "could not start in this image: its loader /lib"},
		{name: "no python", prog: torch, err: startErr("python3"), want: "this image has no python3 on its PATH; the torch probe needs Python with PyTorch"},
		{name: "no self-test", prog: exe, err: startErr("/usr/bin/selftest"), want: "the image's self-test /usr/bin/selftest (its io.gpupin.probe.exec label) is not in the image"},
		{name: "a verdict-less crash is not a start failure", prog: cuda, output: "panic: boom\n"},
		{name: "a file the probe itself misses", prog: torch, output: "FileNotFoundError: [Errno 2] No such file or directory: '/x'\n"},
		{name: "no program", prog: Program{Kind: CUDA}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Explain(tt.prog, []byte(tt.output), tt.err)
			if tt.want == "" {
				if got != "" {
					t.Fatalf("Explain = %q, want nothing", got)
				}
				return
			}
			if !strings.Contains(got, tt.want) {
				t.Fatalf("Explain = %q\nwant it to contain %q", got, tt.want)
			}
		})
	}
}
