package provision

import (
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// Defaults, the same the CLI uses: an embedded agent and an operator's
// `gpupin provision` so exclude each other, and read the same overrides.
const (
	DefaultLockDir      = "/run/gpupin/locks"
	DefaultTimeout      = time.Hour
	DefaultProbeTimeout = 10 * time.Minute
	DefaultProbeMemory  = 16 << 30 // torch and an engine import are large
	DefaultProbePids    = 4096
)

// Option configures a Provisioner.
type Option func(*config)

type config struct {
	Resolver        Resolver
	Node            node.Reader
	Overrides       OverrideSource
	LockDir         string
	Timeout         time.Duration
	ProbeTimeout    time.Duration
	ProbeMemory     uint64
	ProbePids       int64
	GPUs            *containerd.GPUs
	ProbeDir        string
	CUDAProbeBinary string
	SimProbeBinary  string
	DefaultProbe    string
	Progress        func(key string, p containerd.Progress)
	OnState         []func(Status)
	Prefetch        int64 // WithPrefetch (prefetch.go)
	Logger          *slog.Logger
}

func defaults() config {
	return config{
		Overrides:    OverridesFromFile(images.DefaultOverridesPath),
		LockDir:      DefaultLockDir,
		Timeout:      DefaultTimeout,
		ProbeTimeout: DefaultProbeTimeout,
		ProbeMemory:  DefaultProbeMemory,
		ProbePids:    DefaultProbePids,
		ProbeDir:     filepath.Join(os.TempDir(), "gpupin-probe"),
		Logger:       slog.Default(),
	}
}

// WithResolver sets how references are read; default images.Resolver over
// the runtime's registry policy, so what is resolved is what is pulled.
func WithResolver(r Resolver) Option { return func(c *config) { c.Resolver = r } }

// WithNode sets where node facts come from; default NVML (node.NewReader).
func WithNode(r node.Reader) Option { return func(c *config) { c.Node = r } }

// WithOverrides sets where the operator's overrides come from when a want
// names none; default the overrides file at images.DefaultOverridesPath,
// read on every provision.
func WithOverrides(s OverrideSource) Option { return func(c *config) { c.Overrides = s } }

// WithLockDir sets where the per-engine file locks live, shared with every
// gpupin process on the node; default DefaultLockDir.
func WithLockDir(dir string) Option { return func(c *config) { c.LockDir = dir } }

// WithTimeout bounds one provision, pulls and probes included; default
// DefaultTimeout, which zero (or less) keeps. A provision it ends fails
// saying "provision took longer than D (provision timeout)". A registry
// that stalls is cut sooner (registry.Config).
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.Timeout = d
		}
	}
}

// WithProbeTimeout bounds one probe run; default DefaultProbeTimeout,
// which zero (or less) keeps.
func WithProbeTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.ProbeTimeout = d
		}
	}
}

// WithProbeLimits sets the probe container's memory (bytes, swap included:
// memory+swap is set to it) and pids limits. The probe always has both:
// zero keeps the default (DefaultProbeMemory, DefaultProbePids), it never
// means unlimited; the CLI refuses --probe-memory 0.
func WithProbeLimits(memory uint64, pids int64) Option {
	return func(c *config) {
		if memory > 0 {
			c.ProbeMemory = memory
		}
		if pids > 0 {
			c.ProbePids = pids
		}
	}
}

// WithGPUs sets how GPUs reach the probe; default CDI with every GPU, and
// none on a simulated node.
func WithGPUs(g containerd.GPUs) Option { return func(c *config) { c.GPUs = &g } }

// WithProbeDir sets where probe programs are staged on the host.
func WithProbeDir(dir string) Option { return func(c *config) { c.ProbeDir = dir } }

// WithCUDAProbe names the gpupin-cuda-probe binary.
func WithCUDAProbe(path string) Option { return func(c *config) { c.CUDAProbeBinary = path } }

// WithSimProbe names the gpupin-sim-probe binary (the emulator simulated
// fixtures ask for).
func WithSimProbe(path string) Option { return func(c *config) { c.SimProbeBinary = path } }

// WithDefaultProbe names the probe for images whose metadata and engine
// name none: torch, cuda or exec.
func WithDefaultProbe(kind string) Option { return func(c *config) { c.DefaultProbe = kind } }

// WithProgress receives pull progress.
func WithProgress(fn func(key string, p containerd.Progress)) Option {
	return func(c *config) { c.Progress = fn }
}

// WithOnState sees every state change of every provision; it may be given
// more than once.
func WithOnState(fn func(Status)) Option {
	return func(c *config) { c.OnState = append(c.OnState, fn) }
}

// WithLogger sets the logger; default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.Logger = l } }
