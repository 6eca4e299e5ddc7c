package probe

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/gpupin/gpupin/probe/torch"
)

// CUDAProbeName is the file name of the cuda probe binary, on the host and in the container.
const CUDAProbeName = "gpupin-cuda-probe"

// Options carries what Build needs from the host and the image.
type Options struct {
	// Dir is the host directory where gpupin stages probe files; created if missing.
	Dir string
	// CUDAProbeBinary is the gpupin-cuda-probe binary. Default: in
	// $GPUPIN_LIBDIR, beside the running executable, then /usr/lib/gpupin/.
	CUDAProbeBinary string
	// SimProbeBinary is the gpupin-sim-probe binary (the static emulator of
	// the sim probe), looked up as CUDAProbeBinary is.
	SimProbeBinary string
	// ExecArgv is the image's io.gpupin.probe.exec label, parsed (ParseExecLabel).
	ExecArgv []string
	// Engine is the image's engine (vllm, sglang, …); the torch probe imports it.
	Engine string
	// Simulated builds the probe's simulated mode, for a node without a GPU:
	// the real program runs in the image and skips only what needs a device,
	// driven by Sim. Off, every probe is told the node is real, whatever
	// the image's own environment says (GPUPIN_SIMULATED=0).
	Simulated bool
	// Sim describes the simulated node (Simulated, or the Sim kind).
	Sim SimOptions
}

// Lookup locations for the probe binaries; variables so tests can move them.
var (
	executable = os.Executable
	libDir     = "/usr/lib/gpupin"
)

// EnvLibDir names a directory searched first for the probe binaries (tests
// and relocated installs; the flags and Options name a binary exactly).
const EnvLibDir = "GPUPIN_LIBDIR"

// Build returns the program that runs probe k in the image's container.
func Build(k Kind, opt Options) (Program, error) {
	p := Program{Kind: k}
	var simEnv []string
	if opt.Simulated || k == Sim {
		var err error
		if simEnv, err = opt.Sim.env(); err != nil {
			return Program{}, fmt.Errorf("%s probe: %w", k, err)
		}
	} else {
		// An image must not be able to put a probe in its simulated mode
		// on a node with GPUs: gpupin's value wins over the image's.
		simEnv = []string{EnvSimulated + "=0"}
	}
	switch k {
	case Torch:
		src, err := stage(opt.Dir, torch.ScriptName, torch.Script, 0o644)
		if err != nil {
			return Program{}, fmt.Errorf("torch probe: %w", err)
		}
		dst := path.Join(MountDir, torch.ScriptName)
		p.Mounts = []Mount{{Source: src, Destination: dst}}
		p.Args = []string{"python3", dst}
		// The script is read-only and the root filesystem too: no .pyc.
		p.Env = append([]string{"GPUPIN_ENGINE=" + opt.Engine, "PYTHONDONTWRITEBYTECODE=1"}, simEnv...)
	case CUDA:
		bin, err := stagedBinary(CUDAProbeName, opt.CUDAProbeBinary, opt.Dir)
		if err != nil {
			return Program{}, fmt.Errorf("cuda probe: %w", err)
		}
		dst := path.Join(MountDir, CUDAProbeName)
		p.Mounts = []Mount{{Source: bin, Destination: dst}}
		p.Args = []string{dst}
		p.Env = simEnv
	case Exec:
		if len(opt.ExecArgv) == 0 {
			return Program{}, fmt.Errorf("exec probe: the image has no %s label naming its self-test", ExecLabel)
		}
		if err := checkArgv(opt.ExecArgv); err != nil {
			return Program{}, fmt.Errorf("exec probe: %s label: %w", ExecLabel, err)
		}
		p.Args = append([]string(nil), opt.ExecArgv...)
		p.Env = append([]string{"GPUPIN_ENGINE=" + opt.Engine}, simEnv...)
	case Sim:
		bin, err := stagedBinary(SimProbeName, opt.SimProbeBinary, opt.Dir)
		if err != nil {
			return Program{}, fmt.Errorf("sim probe: %w", err)
		}
		dst := path.Join(MountDir, SimProbeName)
		p.Mounts = []Mount{{Source: bin, Destination: dst}}
		p.Args = []string{dst}
		p.Env = simEnv
	default:
		return Program{}, fmt.Errorf("unknown probe %q", k)
	}
	return p, nil
}

// ParseExecLabel reads the io.gpupin.probe.exec label: a non-empty JSON array
// of strings, the first of which is the command.
func ParseExecLabel(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%s label is empty; want a JSON argv such as [\"/usr/bin/selftest\",\"--gpu\"]", ExecLabel)
	}
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		return nil, fmt.Errorf("%s label %q is not a JSON array of strings: %w", ExecLabel, s, err)
	}
	if err := checkArgv(argv); err != nil {
		return nil, fmt.Errorf("%s label %q: %w", ExecLabel, s, err)
	}
	return argv, nil
}

func checkArgv(argv []string) error {
	if len(argv) == 0 {
		return errors.New("argv is empty")
	}
	if strings.TrimSpace(argv[0]) == "" {
		return errors.New("argv[0] (the command) is empty")
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("argv[%d] contains a NUL byte", i)
		}
	}
	return nil
}

// findBinary returns a probe binary: explicit, else in $GPUPIN_LIBDIR, else
// beside the running executable, else in libDir.
func findBinary(name, explicit string) (string, error) {
	var tried []string
	try := func(p string) (string, bool) {
		tried = append(tried, p)
		fi, err := os.Stat(p)
		return p, err == nil && fi.Mode().IsRegular()
	}
	if explicit != "" {
		abs, err := filepath.Abs(explicit)
		if err != nil {
			return "", fmt.Errorf("probe binary %s: %w", explicit, err)
		}
		if p, ok := try(abs); ok {
			return p, nil
		}
		return "", fmt.Errorf("probe binary %s is not a regular file", abs)
	}
	if dir := os.Getenv(EnvLibDir); dir != "" {
		if abs, err := filepath.Abs(dir); err == nil {
			if p, ok := try(filepath.Join(abs, name)); ok {
				return p, nil
			}
		}
	}
	if exe, err := executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		if p, ok := try(filepath.Join(filepath.Dir(exe), name)); ok {
			return p, nil
		}
	}
	if p, ok := try(filepath.Join(libDir, name)); ok {
		return p, nil
	}
	return "", fmt.Errorf("no %s binary (looked in %s); %s", name, strings.Join(tried, ", "), installHint(name))
}

// modulePath is the module the probe programs are part of.
const modulePath = "github.com/gpupin/gpupin"

// installHint says how to put a probe program where gpupin finds it: the
// exact command for this gpupin's version and directory. `go build` and
// `go install` of gpupin make gpupin alone; the probes are programs of
// their own, static (no cgo), since they run inside other images.
func installHint(name string) string {
	dir := ""
	if exe, err := executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		dir = filepath.Dir(exe)
	}
	version := ""
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Path == modulePath && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		version = bi.Main.Version
	}
	if dir == "" {
		return fmt.Sprintf("install the probe programs with `CGO_ENABLED=0 go install %s/cmd/gpupin-cuda-probe@latest %s/cmd/gpupin-sim-probe@latest` into gpupin's directory, or into %s", modulePath, modulePath, libDir)
	}
	if version != "" {
		// gpupin came from go install: the same version, into its directory.
		return fmt.Sprintf("install the probe programs beside gpupin: `CGO_ENABLED=0 GOBIN=%s go install %s/cmd/gpupin-cuda-probe@%s %s/cmd/gpupin-sim-probe@%s`",
			dir, modulePath, version, modulePath, version)
	}
	return fmt.Sprintf("build the probe programs beside gpupin, in gpupin's checkout: `CGO_ENABLED=0 go build -o %s/ ./cmd/gpupin-cuda-probe ./cmd/gpupin-sim-probe` (or `make build`)", dir)
}

// Binary is the host program probe k bind-mounts, found as Build finds it
// (opt's CUDAProbeBinary and SimProbeBinary, $GPUPIN_LIBDIR, beside
// gpupin, libDir): "" for a probe that mounts none (torch, exec). A
// provision asks before it pulls, so that a missing program costs no pull.
func Binary(k Kind, opt Options) (string, error) {
	switch k {
	case CUDA:
		return findBinary(CUDAProbeName, opt.CUDAProbeBinary)
	case Sim:
		return findBinary(SimProbeName, opt.SimProbeBinary)
	}
	return "", nil
}

// stagedBinary is the probe binary name, found as findBinary finds it,
// copied into the staging directory dir: containerd resolves a mount's
// source on the host, and gpupin may run where the host's paths are not
// its own (the agent's container, whose /usr/lib/gpupin the host lacks),
// while dir is a host path mounted at the same path (--probe-dir). With no
// dir the binary is mounted from where it was found.
func stagedBinary(name, explicit, dir string) (string, error) {
	bin, err := findBinary(name, explicit)
	if err != nil || dir == "" {
		return bin, err
	}
	content, err := os.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", bin, err)
	}
	return stage(dir, name, content, 0o755)
}

// stage writes content into dir under a name carrying its hash, so that
// gpupin versions sharing dir never overwrite a file a running probe has
// mounted, and writes are atomic (temp file + rename).
func stage(dir, name string, content []byte, mode os.FileMode) (string, error) {
	if dir == "" {
		return "", errors.New("no staging directory (Options.Dir)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create staging directory: %w", err)
	}
	sum := sha256.Sum256(content)
	ext := filepath.Ext(name)
	dst := filepath.Join(dir, strings.TrimSuffix(name, ext)+"-"+hex.EncodeToString(sum[:6])+ext)
	if old, err := os.ReadFile(dst); err == nil && string(old) == string(content) {
		return dst, nil
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return "", fmt.Errorf("stage %s: %w", name, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(content); err != nil {
		tmp.Close()
		return "", fmt.Errorf("stage %s: %w", name, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return "", fmt.Errorf("stage %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("stage %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("stage %s: %w", name, err)
	}
	return dst, nil
}
