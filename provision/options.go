package provision

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
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

// Option configures a Provisioner. One that refuses its value makes New
// fail, naming it, rather than leaving a default the caller did not ask
// for in its place.
type Option func(*config) error

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
	Prefetch        int64     // WithPrefetch (prefetch.go)
	FetchGate       FetchGate // WithFetchGate (fetchgate.go)
	Verifier        Verifier  // WithVerifier (verify.go)
	Canary          Canary    // WithCanary (canary.go)
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
func WithResolver(r Resolver) Option {
	return func(c *config) error {
		if r == nil {
			return errors.New("WithResolver(nil): leave the option out for the default")
		}
		c.Resolver = r
		return nil
	}
}

// WithNode sets where node facts come from; default NVML (node.NewReader).
func WithNode(r node.Reader) Option {
	return func(c *config) error {
		if r == nil {
			return errors.New("WithNode(nil): leave the option out for NVML")
		}
		c.Node = r
		return nil
	}
}

// WithOverrides sets where the operator's overrides come from when a want
// names none; default the overrides file at images.DefaultOverridesPath,
// read on every provision. NoOverrides() reads none.
func WithOverrides(s OverrideSource) Option {
	return func(c *config) error {
		if s == nil {
			return errors.New("WithOverrides(nil): use NoOverrides() for none")
		}
		c.Overrides = s
		return nil
	}
}

// WithLockDir sets where the per-engine file locks live, shared with every
// gpupin process on the node; default DefaultLockDir.
func WithLockDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("WithLockDir: empty directory")
		}
		c.LockDir = dir
		return nil
	}
}

// WithTimeout bounds one provision, pulls and probes included; default
// DefaultTimeout, which zero keeps. A provision it ends fails saying
// "provision took longer than D (provision timeout)". A registry that
// stalls is cut sooner (registry.Config).
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithTimeout(%s): a negative timeout would end every provision at once", d)
		}
		if d > 0 {
			c.Timeout = d
		}
		return nil
	}
}

// WithProbeTimeout bounds one probe run; default DefaultProbeTimeout,
// which zero keeps.
func WithProbeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithProbeTimeout(%s): a negative timeout would end every probe at once", d)
		}
		if d > 0 {
			c.ProbeTimeout = d
		}
		return nil
	}
}

// WithProbeLimits sets the probe container's memory (bytes, swap included:
// memory+swap is set to it) and pids limits. The probe always has both:
// zero keeps the default (DefaultProbeMemory, DefaultProbePids), it never
// means unlimited; the CLI refuses --probe-memory 0.
func WithProbeLimits(memory uint64, pids int64) Option {
	return func(c *config) error {
		if pids < 0 {
			return fmt.Errorf("WithProbeLimits: pids %d: the probe always has a pids limit", pids)
		}
		if memory > 0 {
			c.ProbeMemory = memory
		}
		if pids > 0 {
			c.ProbePids = pids
		}
		return nil
	}
}

// WithGPUs sets how GPUs reach the probe; default CDI with every GPU, and
// none on a simulated node.
func WithGPUs(g containerd.GPUs) Option { return func(c *config) error { c.GPUs = &g; return nil } }

// WithProbeDir sets where probe programs are staged on the host.
func WithProbeDir(dir string) Option {
	return func(c *config) error {
		if dir == "" {
			return errors.New("WithProbeDir: empty directory")
		}
		c.ProbeDir = dir
		return nil
	}
}

// WithCUDAProbe names the gpupin-cuda-probe binary.
func WithCUDAProbe(path string) Option {
	return func(c *config) error { c.CUDAProbeBinary = path; return nil }
}

// WithSimProbe names the gpupin-sim-probe binary (the emulator simulated
// fixtures ask for).
func WithSimProbe(path string) Option {
	return func(c *config) error { c.SimProbeBinary = path; return nil }
}

// WithDefaultProbe names the probe for images whose metadata and engine
// name none: torch, cuda, exec or sim. Another name is refused here, not
// met only when an engine without a probe of its own is provisioned.
func WithDefaultProbe(kind string) Option {
	return func(c *config) error {
		if kind != "" {
			if _, err := probe.ParseDefault(kind); err != nil {
				return fmt.Errorf("WithDefaultProbe(%q): %w", kind, err)
			}
		}
		c.DefaultProbe = kind
		return nil
	}
}

// WithProgress receives pull progress.
func WithProgress(fn func(key string, p containerd.Progress)) Option {
	return func(c *config) error { c.Progress = fn; return nil }
}

// WithOnState sees every state change of every provision; it may be given
// more than once.
func WithOnState(fn func(Status)) Option {
	return func(c *config) error {
		if fn == nil {
			return errors.New("WithOnState(nil): leave the option out")
		}
		c.OnState = append(c.OnState, fn)
		return nil
	}
}

// WithLogger sets the logger; default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("WithLogger(nil): leave the option out for slog.Default()")
		}
		c.Logger = l
		return nil
	}
}
