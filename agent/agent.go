package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/runtime"
)

// PinLister lists the pins in the agent's containerd namespace.
type PinLister interface {
	Pins(ctx context.Context) ([]runtime.Pin, error)
}

// Options configure an Agent.
type Options struct {
	// ConfigPath is the wants file (Config); empty: wants come from the API only.
	ConfigPath string
	// OverridesPath is the node's overrides file, the one `gpupin override`
	// writes; PUT /v1/overrides writes it too, so an override outlives a
	// restart. Empty: overrides set through the API live in memory.
	OverridesPath string
	Logger        *slog.Logger
	// Sweeper removes what interrupted gpupin processes left; nil: the
	// PinLister, when it is one (a *runtime.Runtime is).
	Sweeper Sweeper
	// SweepEvery is how often Watch sweeps leftovers whose owner is gone:
	// a probe orphaned after the loop's sweep at start (an agent killed
	// while a new one started, a `gpupin provision` killed beside the
	// agent) is stopped within it. Default DefaultSweepEvery; negative: no
	// periodic sweep.
	SweepEvery time.Duration
	// Recoverer puts back pins other clients of containerd took (kubelet's
	// image GC, a pull of a pinned reference), on the same timer as the
	// sweep; nil: the PinLister, when it is one (a *runtime.Runtime is).
	Recoverer Recoverer
	// NFDFeaturesDir is node-feature-discovery's features.d directory:
	// the agent keeps a file there (FeatureFile) with a label per ready
	// engine, gpupin.io/ENGINE-VERSION=VARIANT. Empty: no file.
	NFDFeaturesDir string
}

// Recoverer restores pins other clients took (runtime.Runtime.Recover).
type Recoverer interface {
	Recover(ctx context.Context) ([]runtime.Recovered, error)
}

// DefaultSweepEvery is the default Options.SweepEvery. A sweep is three
// label-filtered listings when there is nothing to remove; an orphaned
// probe holds GPUs until it is found.
const DefaultSweepEvery = 30 * time.Second

// Sweeper removes leftovers whose owning process is gone, keeping what a
// failed pull set aside for its retry (runtime.Runtime.SweepOrphans).
type Sweeper interface {
	SweepOrphans(ctx context.Context) (runtime.Swept, error)
}

// InputError is a request the agent refuses as malformed.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// Agent feeds a provision.Loop from its files and its API.
type Agent struct {
	loop *provision.Loop
	pins PinLister
	opts Options

	mu       sync.Mutex
	cfg      *Config
	cfgData  []byte
	apiWants []provision.Want // nil: the file's wants hold
	fileOv   map[string]string

	features *FeatureFile // nil: no NFD feature file

	watching chan struct{} // closed once Watch sees the files' directories
	reloads  atomic.Int64  // reloads Watch has done
	sweeps   atomic.Int64  // periodic sweeps Watch has done
}

// New makes an Agent over a loop; call Reload to read the files.
func New(loop *provision.Loop, pins PinLister, opts Options) *Agent {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Sweeper == nil {
		opts.Sweeper, _ = pins.(Sweeper)
	}
	if opts.Recoverer == nil {
		opts.Recoverer, _ = pins.(Recoverer)
	}
	if opts.SweepEvery == 0 {
		opts.SweepEvery = DefaultSweepEvery
	}
	a := &Agent{loop: loop, pins: pins, opts: opts, cfg: &Config{}, fileOv: map[string]string{}, watching: make(chan struct{})}
	if opts.NFDFeaturesDir != "" {
		f, err := NewFeatureFile(opts.NFDFeaturesDir)
		if err != nil {
			// Only what an earlier run wrote is lost: labels of engines
			// not yet looked at go until their first pass.
			opts.Logger.Warn("NFD feature file: starting from none", "err", err)
			f = &FeatureFile{Path: filepath.Join(opts.NFDFeaturesDir, NFDFileName)}
		}
		a.features = f
	}
	return a
}

// StatusChanged is the loop's OnChange for an agent: the NFD feature file
// follows every change of an engine's state (provision.LoopOptions.OnChange).
func (a *Agent) StatusChanged(provision.Status) { a.SyncFeatures() }

// SyncFeatures writes the NFD feature file from the engines' statuses if
// it changed; without Options.NFDFeaturesDir it does nothing.
func (a *Agent) SyncFeatures() {
	if a.features == nil {
		return
	}
	wrote, err := a.features.Sync(a.loop.Status())
	switch {
	case err != nil:
		a.opts.Logger.Error("NFD feature file not written; node labels may be stale", "path", a.features.Path, "err", err)
	case wrote:
		a.opts.Logger.Info("NFD feature file written", "path", a.features.Path)
	}
}

// FeaturesPath is the NFD feature file the agent keeps, or "".
func (a *Agent) FeaturesPath() string {
	if a.features == nil {
		return ""
	}
	return a.features.Path
}

// Loop is the loop the agent feeds.
func (a *Agent) Loop() *provision.Loop { return a.loop }

// Reload reads the wants file and the overrides file and hands what
// changed to the loop. A file that does not parse is reported and the
// last good reading is kept: a bad edit must not drop every engine.
// Wants set through the API hold until the wants file changes.
func (a *Agent) Reload() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	if a.opts.ConfigPath != "" {
		cfg, data, err := LoadConfig(a.opts.ConfigPath)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !bytes.Equal(data, a.cfgData):
			a.cfg, a.cfgData, a.apiWants = cfg, data, nil
			a.opts.Logger.Info("read agent config", "path", a.opts.ConfigPath, "wants", len(cfg.Wants), "overrides", len(cfg.Overrides))
		}
	}
	if a.opts.OverridesPath != "" {
		of, err := images.LoadOverrides(a.opts.OverridesPath)
		if err != nil {
			errs = append(errs, err)
		} else if !maps.Equal(of.Overrides, a.fileOv) {
			a.fileOv = of.Overrides
			a.opts.Logger.Info("read overrides file", "path", a.opts.OverridesPath, "overrides", len(of.Overrides))
		}
	}
	if err := a.apply(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// apply hands the wants and the merged overrides to the loop. Called with mu held.
func (a *Agent) apply() error {
	wants := a.cfg.Wants
	if a.apiWants != nil {
		wants = a.apiWants
	}
	// The node's overrides file is the operator's latest word, over the config's.
	ov := maps.Clone(a.cfg.Overrides)
	if ov == nil {
		ov = map[string]string{}
	}
	maps.Copy(ov, a.fileOv)
	if err := a.loop.SetOverrides(ov); err != nil {
		return fmt.Errorf("overrides: %w", err)
	}
	if err := a.loop.SetWants(wants); err != nil {
		return fmt.Errorf("wants: %w", err)
	}
	// An engine no longer wanted reports no change: its line goes here.
	a.SyncFeatures()
	return nil
}

// SetWants replaces the wants until the wants file next changes.
func (a *Agent) SetWants(wants []provision.Want) error {
	if err := CheckWants(wants); err != nil {
		return &InputError{err}
	}
	if wants == nil {
		wants = []provision.Want{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.apiWants = wants
	return a.apply()
}

// OverrideSet is what SetOverride did.
type OverrideSet struct {
	Override images.Override
	// Wanted reports whether a wanted engine has the name now. An engine
	// is named when its image is first read (io.gpupin.engine, else its
	// repository's last element); until then, during a registry outage
	// say, the override is kept and applies from its first plan.
	Wanted bool
	// Named are the names the wanted engines have now; Unnamed the wants
	// (by key) whose engine has none yet.
	Named, Unnamed []string
}

// SetOverride sets an engine's override, writes it to the overrides file,
// and has the loop act on it at once. Any engine name of the grammar is
// taken, wanted or not: an operator must be able to say none for an engine
// whose image cannot be read yet, before it has a name.
func (a *Agent) SetOverride(engine, value string) (OverrideSet, error) {
	if !images.ValidEngineName(engine) {
		return OverrideSet{}, &InputError{fmt.Errorf("%q is not an engine name (lower-case letters, digits, '.', '_', '-')", engine)}
	}
	o, err := images.ParseOverride(value)
	if err != nil {
		return OverrideSet{}, &InputError{err}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.opts.OverridesPath != "" {
		var inputErr error
		of, err := images.UpdateOverrides(a.opts.OverridesPath, func(of *images.OverrideFile) error {
			_, inputErr = of.Set(engine, o.String())
			return inputErr
		})
		if inputErr != nil {
			return OverrideSet{}, &InputError{inputErr}
		}
		if err != nil {
			return OverrideSet{}, fmt.Errorf("save override: %w", err)
		}
		a.fileOv = of.Overrides
	} else {
		a.fileOv = maps.Clone(a.fileOv)
		a.fileOv[engine] = o.String()
	}
	if err := a.apply(); err != nil {
		return OverrideSet{}, err
	}
	named := a.loop.Engines()
	return OverrideSet{Override: o, Wanted: slices.Contains(named, engine), Named: named, Unnamed: a.loop.Unnamed()}, nil
}

// Status is the latest status of every wanted engine.
func (a *Agent) Status() []provision.Status { return a.loop.Status() }

// Pins lists the pins in containerd, wanted or not.
func (a *Agent) Pins(ctx context.Context) ([]runtime.Pin, error) { return a.pins.Pins(ctx) }
