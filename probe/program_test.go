package probe

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/probe/torch"
)

func TestParseExecLabel(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: `["/usr/bin/selftest","--gpu","all"]`, want: []string{"/usr/bin/selftest", "--gpu", "all"}},
		{in: ` ["selftest"] `, want: []string{"selftest"}},
		{in: ``, wantErr: "label is empty"},
		{in: `[]`, wantErr: "argv is empty"},
		{in: `[""]`, wantErr: "argv[0] (the command) is empty"},
		{in: `"/usr/bin/selftest"`, wantErr: "not a JSON array of strings"},
		{in: `/usr/bin/selftest --gpu`, wantErr: "not a JSON array of strings"},
		{in: `["a",1]`, wantErr: "not a JSON array of strings"},
		{in: `["a","b\u0000"]`, wantErr: "argv[1] contains a NUL byte"},
		{in: `null`, wantErr: "argv is empty"},
	}
	for _, tt := range tests {
		got, err := ParseExecLabel(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseExecLabel(%q) = %q, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseExecLabel(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// withLookup points the cuda probe lookup at a fake executable and lib dir.
func withLookup(t *testing.T, exe, lib string) {
	t.Helper()
	oldExe, oldLib := executable, libDir
	executable = func() (string, error) {
		if exe == "" {
			return "", errors.New("no executable")
		}
		return exe, nil
	}
	libDir = lib
	t.Cleanup(func() { executable, libDir = oldExe, oldLib })
}

func writeFile(t *testing.T, p string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	// Each file's own content: a staged copy then says which was found.
	if err := os.WriteFile(p, []byte("#!/bin/true\n# "+p+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBuild(t *testing.T) {
	root := t.TempDir()
	besideDir := filepath.Join(root, "bin")
	beside := writeFile(t, filepath.Join(besideDir, CUDAProbeName))
	lib := writeFile(t, filepath.Join(root, "lib", CUDAProbeName))
	explicit := writeFile(t, filepath.Join(root, "explicit", "probe"))
	libEnv := writeFile(t, filepath.Join(root, "libenv", CUDAProbeName))
	simBeside := writeFile(t, filepath.Join(besideDir, SimProbeName))

	tests := []struct {
		name       string
		kind       Kind
		opt        Options
		exe, lib   string // lookup locations
		libEnv     string // GPUPIN_LIBDIR
		wantArgs   []string
		wantSource string // the mount's host path ("" = no mount); "staged" = under Dir
		wantDest   string
		wantEnv    []string
		wantErr    string
	}{
		{
			name: "torch", kind: Torch, opt: Options{Engine: "vllm"},
			wantArgs: []string{"python3", "/.gpupin-probe/gpupin_probe.py"}, wantSource: "staged",
			wantDest: "/.gpupin-probe/gpupin_probe.py", wantEnv: []string{"GPUPIN_ENGINE=vllm", "PYTHONDONTWRITEBYTECODE=1", "GPUPIN_SIMULATED=0"},
		},
		{
			name: "torch simulated", kind: Torch, opt: Options{Engine: "vllm", Simulated: true, Sim: SimOptions{Devices: []Device{{Index: 0, UUID: "GPU-x", CC: "9.0"}}, NodeCUDA: "12.9", VariantCUDA: "12.8"}},
			wantArgs: []string{"python3", "/.gpupin-probe/gpupin_probe.py"}, wantSource: "staged",
			wantDest: "/.gpupin-probe/gpupin_probe.py", wantEnv: []string{"GPUPIN_ENGINE=vllm", "PYTHONDONTWRITEBYTECODE=1", "GPUPIN_SIMULATED=1",
				`GPUPIN_SIM_DEVICES=[{"index":0,"uuid":"GPU-x","name":"","cc":"9.0","tflops":0,"max_abs_err":0}]`, "GPUPIN_SIM_NODE_CUDA=12.9", "GPUPIN_SIM_VARIANT_CUDA=12.8"},
		},
		{name: "torch simulated without devices", kind: Torch, opt: Options{Simulated: true}, wantErr: "torch probe: no simulated devices"},
		{name: "torch simulated bad variant version", kind: Torch, opt: Options{Simulated: true, Sim: SimOptions{Devices: []Device{{}}, VariantCUDA: "cu129"}},
			wantErr: `variant CUDA version "cu129" is not a version like 12.9`},
		{
			name: "cuda explicit", kind: CUDA, opt: Options{CUDAProbeBinary: explicit},
			exe: filepath.Join(besideDir, "gpupin"), wantArgs: []string{"/.gpupin-probe/gpupin-cuda-probe"},
			wantSource: explicit, wantDest: "/.gpupin-probe/gpupin-cuda-probe", wantEnv: []string{"GPUPIN_SIMULATED=0"},
		},
		{
			name: "cuda simulated", kind: CUDA, opt: Options{CUDAProbeBinary: explicit, Simulated: true, Sim: SimOptions{Devices: []Device{{Index: 0, UUID: "GPU-x"}}}},
			exe: filepath.Join(besideDir, "gpupin"), wantArgs: []string{"/.gpupin-probe/gpupin-cuda-probe"},
			wantSource: explicit, wantDest: "/.gpupin-probe/gpupin-cuda-probe", wantEnv: []string{"GPUPIN_SIMULATED=1",
				`GPUPIN_SIM_DEVICES=[{"index":0,"uuid":"GPU-x","name":"","cc":"","tflops":0,"max_abs_err":0}]`, "GPUPIN_SIM_NODE_CUDA=", "GPUPIN_SIM_VARIANT_CUDA="},
		},
		{
			name: "cuda explicit missing", kind: CUDA, opt: Options{CUDAProbeBinary: filepath.Join(root, "nope")},
			exe: filepath.Join(besideDir, "gpupin"), wantErr: "is not a regular file",
		},
		{
			name: "cuda beside the executable", kind: CUDA,
			exe: filepath.Join(besideDir, "gpupin"), lib: filepath.Dir(lib),
			wantArgs: []string{"/.gpupin-probe/gpupin-cuda-probe"}, wantSource: beside, wantDest: "/.gpupin-probe/gpupin-cuda-probe",
			wantEnv: []string{"GPUPIN_SIMULATED=0"},
		},
		{
			name: "cuda from GPUPIN_LIBDIR", kind: CUDA, libEnv: filepath.Join(root, "libenv"),
			exe: filepath.Join(besideDir, "gpupin"), lib: filepath.Dir(lib),
			wantArgs: []string{"/.gpupin-probe/gpupin-cuda-probe"}, wantSource: libEnv, wantDest: "/.gpupin-probe/gpupin-cuda-probe",
			wantEnv: []string{"GPUPIN_SIMULATED=0"},
		},
		{
			name: "cuda with an empty GPUPIN_LIBDIR", kind: CUDA, libEnv: filepath.Join(root, "nolib"),
			exe: filepath.Join(besideDir, "gpupin"), lib: filepath.Dir(lib),
			wantArgs: []string{"/.gpupin-probe/gpupin-cuda-probe"}, wantSource: beside, wantDest: "/.gpupin-probe/gpupin-cuda-probe",
			wantEnv: []string{"GPUPIN_SIMULATED=0"},
		},
		{
			name: "cuda from lib dir", kind: CUDA,
			exe: filepath.Join(root, "elsewhere", "gpupin"), lib: filepath.Dir(lib),
			wantArgs: []string{"/.gpupin-probe/gpupin-cuda-probe"}, wantSource: lib, wantDest: "/.gpupin-probe/gpupin-cuda-probe",
			wantEnv: []string{"GPUPIN_SIMULATED=0"},
		},
		{
			name: "cuda nowhere", kind: CUDA, exe: filepath.Join(root, "elsewhere", "gpupin"), lib: filepath.Join(root, "nolib"),
			wantErr: "no gpupin-cuda-probe binary (looked in " + filepath.Join(root, "elsewhere", CUDAProbeName),
		},
		{
			name: "exec", kind: Exec, opt: Options{ExecArgv: []string{"/opt/selftest", "--all"}, Engine: "trtllm"},
			wantArgs: []string{"/opt/selftest", "--all"}, wantEnv: []string{"GPUPIN_ENGINE=trtllm", "GPUPIN_SIMULATED=0"},
		},
		{
			name: "exec simulated", kind: Exec, opt: Options{ExecArgv: []string{"/opt/selftest"}, Engine: "trtllm", Simulated: true, Sim: SimOptions{Devices: []Device{{Index: 0}}, NodeCUDA: "13.0"}},
			wantArgs: []string{"/opt/selftest"}, wantEnv: []string{"GPUPIN_ENGINE=trtllm", "GPUPIN_SIMULATED=1",
				`GPUPIN_SIM_DEVICES=[{"index":0,"uuid":"","name":"","cc":"","tflops":0,"max_abs_err":0}]`, "GPUPIN_SIM_NODE_CUDA=13.0", "GPUPIN_SIM_VARIANT_CUDA="},
		},
		{name: "exec without label", kind: Exec, wantErr: "the image has no io.gpupin.probe.exec label"},
		{name: "exec bad argv", kind: Exec, opt: Options{ExecArgv: []string{""}}, wantErr: "argv[0] (the command) is empty"},
		{
			name: "sim", kind: Sim, opt: Options{Sim: SimOptions{Devices: []Device{{Index: 0, UUID: "GPU-x"}}, NodeCUDA: "12.9"}},
			exe: filepath.Join(besideDir, "gpupin"), wantArgs: []string{"/.gpupin-probe/gpupin-sim-probe"}, wantSource: simBeside, wantDest: "/.gpupin-probe/gpupin-sim-probe",
			wantEnv: []string{"GPUPIN_SIMULATED=1", `GPUPIN_SIM_DEVICES=[{"index":0,"uuid":"GPU-x","name":"","cc":"","tflops":0,"max_abs_err":0}]`, "GPUPIN_SIM_NODE_CUDA=12.9", "GPUPIN_SIM_VARIANT_CUDA="},
		},
		{
			name: "sim nowhere", kind: Sim, opt: Options{Sim: SimOptions{Devices: []Device{{}}}}, exe: filepath.Join(root, "elsewhere", "gpupin"), lib: filepath.Join(root, "nolib"),
			wantErr: "no gpupin-sim-probe binary",
		},
		{name: "sim without devices", kind: Sim, wantErr: "no simulated devices"},
		{name: "sim bad node version", kind: Sim, opt: Options{Sim: SimOptions{Devices: []Device{{}}, NodeCUDA: "12.9; rm"}}, wantErr: "is not a version like 12.9"},
		{name: "unknown", kind: "jax", wantErr: `unknown probe "jax"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withLookup(t, tt.exe, tt.lib)
			t.Setenv(EnvLibDir, tt.libEnv)
			if tt.opt.Dir == "" {
				tt.opt.Dir = filepath.Join(t.TempDir(), "stage", "new")
			}
			p, err := Build(tt.kind, tt.opt)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Build = %+v, %v; want error containing %q", p, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			if p.Kind != tt.kind || !slices.Equal(p.Args, tt.wantArgs) || !slices.Equal(p.Env, tt.wantEnv) {
				t.Fatalf("Build = %+v; want args %q env %q", p, tt.wantArgs, tt.wantEnv)
			}
			if tt.wantSource == "" {
				if len(p.Mounts) != 0 {
					t.Fatalf("mounts = %+v, want none", p.Mounts)
				}
				return
			}
			if len(p.Mounts) != 1 || p.Mounts[0].Destination != tt.wantDest {
				t.Fatalf("mounts = %+v, want one at %s", p.Mounts, tt.wantDest)
			}
			src := p.Mounts[0].Source
			if tt.wantSource == "staged" {
				if filepath.Dir(src) != tt.opt.Dir {
					t.Fatalf("staged at %s, want under %s", src, tt.opt.Dir)
				}
			} else {
				// A binary is found where tt.wantSource says and mounted
				// from its copy in the staging directory: the host path
				// containerd resolves, wherever gpupin itself runs.
				want, err := os.ReadFile(tt.wantSource)
				if err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(src)
				if filepath.Dir(src) != tt.opt.Dir || err != nil || string(got) != string(want) {
					t.Fatalf("mount source = %s (%v): want a copy of %s under %s", src, err, tt.wantSource, tt.opt.Dir)
				}
				if st, err := os.Stat(src); err != nil || st.Mode().Perm()&0o111 == 0 {
					t.Fatalf("staged binary %s not executable: %v %v", src, st.Mode(), err)
				}
			}
		})
	}
}

func TestStageIsIdempotentAndExact(t *testing.T) {
	dir := t.TempDir()
	p1, err := Build(Torch, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Build(Torch, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	src := p1.Mounts[0].Source
	if src != p2.Mounts[0].Source {
		t.Fatalf("staged twice under different names: %s, %s", src, p2.Mounts[0].Source)
	}
	got, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, torch.Script) {
		t.Fatal("staged script differs from the embedded one")
	}
	fi, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("staged mode %v, want 0644 (readable by any container user)", fi.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("staging dir holds %d entries, want 1 (no temp files left)", len(entries))
	}

	// A corrupted staged file is rewritten.
	if err := os.WriteFile(src, []byte("broken"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Torch, Options{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(src); !bytes.Equal(got, torch.Script) {
		t.Fatal("corrupted staged script was not rewritten")
	}
}

func TestBuildNeedsDir(t *testing.T) {
	if _, err := Build(Torch, Options{}); err == nil || !strings.Contains(err.Error(), "no staging directory") {
		t.Fatalf("Build without Dir: %v", err)
	}
}
