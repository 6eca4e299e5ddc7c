// Package agent is gpupin's node agent: a provision.Loop fed by a wants
// file it watches, by a local HTTP API on a unix socket and by its
// embedder, with optional Prometheus metrics, a periodic pass that
// restores pins other clients took, and node-feature-discovery labels.
//
// Start with Run and a RunConfig: a *containerd.Runtime (containerd.Connect),
// or any RunRuntime, is all it needs, and its zero value is the CLI's safe defaults (the
// operator's overrides file, the shared lock directory, NVML):
//
//	err := agent.Run(ctx, agent.RunConfig{
//		Runtime: rt,
//		Wants:   []provision.Want{{Ref: "registry.example/org/vllm:0.11.0"}},
//		Loop:    provision.LoopOptions{OnChange: startOrDrainReplicas},
//	})
//
// `gpupin agent` is that call with flags. New, Reload, Watch and Maintain
// are Run's parts, for a program that assembles its own.
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

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

// Runtime is everything the agent asks of containerd, said in full
// (containerd.Runtime is all of it): a part it lacks is a compile error,
// not a feature lost without a word.
type Runtime interface {
	PinLister
	Sweeper
	Recoverer
	ForeignReporter
}

// PinLister lists the pins in the agent's containerd namespace as
// containerd holds them: the agent's reads (GET /v1/pins, its pass's
// check of the ready engines) write nothing; its Recoverer restores.
type PinLister interface {
	ListPins(ctx context.Context) ([]containerd.Pin, error)
}

// Options configure an Agent.
type Options struct {
	// ConfigPath is the wants file (Config); empty: wants come from the API only.
	ConfigPath string
	// OverridesPath is the node's overrides file, the one `gpupin override`
	// writes; PUT /v1/overrides writes it too, so an override outlives a
	// restart. Empty: Run reads images.DefaultOverridesPath, as the CLI
	// does; New takes it as given, and overrides set through the API then
	// live in memory.
	OverridesPath string
	// NoOverridesFile makes Run read and write no overrides file: an
	// embedder that sets every override itself (Want.Override, the API).
	NoOverridesFile bool
	Logger          *slog.Logger
	// Sweeper removes what interrupted gpupin processes left; nil: the
	// runtime's.
	Sweeper Sweeper
	// SweepEvery is the period of Maintain's pass: leftovers whose owner
	// is gone are swept (a probe orphaned after the loop's sweep at start,
	// an agent killed while a new one started, a `gpupin provision` killed
	// beside the agent), pins other clients took are restored, and a ready
	// engine whose pin went loses its node label, all within it. Default
	// DefaultSweepEvery; negative: no periodic pass.
	SweepEvery time.Duration
	// Recoverer puts back pins other clients of containerd took (kubelet's
	// image GC, a pull of a pinned reference), on the same timer as the
	// sweep; nil: the runtime's.
	Recoverer Recoverer
	// NFDFeaturesDir is node-feature-discovery's features.d directory:
	// the agent keeps a file there (FeatureFile) with a label per ready
	// engine, gpupin.io/ENGINE-VERSION=VARIANT. Empty: no file.
	NFDFeaturesDir string
}

// Recoverer restores pins other clients took (containerd.Runtime.Recover).
type Recoverer interface {
	Recover(ctx context.Context) ([]containerd.Recovered, error)
}

// ForeignReporter tells of records of a node-local name that gpupin did
// not write (containerd.Runtime.OnForeign); the agent reports them.
type ForeignReporter interface {
	OnForeign(func(containerd.Recovered))
}

// ForeignRecord is a record of a node-local name that gpupin did not
// write on this node (pulled from a peer through a mirror, made by hand),
// and what was done with it: replaced by the node's own, or removed.
type ForeignRecord struct {
	At time.Time `json:"at"`
	containerd.Recovered
}

// keptForeign is how many ForeignRecords the status keeps, newest last.
const keptForeign = 16

// DefaultSweepEvery is the default Options.SweepEvery. A sweep is three
// label-filtered listings when there is nothing to remove; an orphaned
// probe holds GPUs until it is found.
const DefaultSweepEvery = 30 * time.Second

// Sweeper removes leftovers whose owning process is gone, keeping what a
// failed pull set aside for its retry (containerd.Runtime.SweepOrphans).
type Sweeper interface {
	SweepOrphans(ctx context.Context) (containerd.Swept, error)
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
	// clusterOv are the overrides the fleet layer resolved from the
	// Kubernetes API (package fleet): over the files', per engine.
	clusterOv map[string]string

	features *FeatureFile // nil: no NFD feature file
	goneMu   sync.Mutex
	syncMu   sync.Mutex // SyncFeatures
	// gone holds ready statuses (by key, the status's At) whose pin
	// CheckPins found gone: their NFD lines are left out until the loop
	// reports the engine anew.
	gone map[string]time.Time

	watching chan struct{} // closed once Watch sees the files' directories
	reloads  atomic.Int64  // reloads Watch has done

	foreignMu sync.Mutex
	foreign   []ForeignRecord // the last keptForeign, newest last
	foreignN  int64
	metrics   *Metrics     // set by Run when it serves metrics
	sweeps    atomic.Int64 // periodic sweeps Watch has done
}

// New makes an Agent over a loop; call Reload to read the files.
func New(loop *provision.Loop, rt Runtime, opts Options) *Agent {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Sweeper == nil {
		opts.Sweeper = rt
	}
	if opts.Recoverer == nil {
		opts.Recoverer = rt
	}
	if opts.SweepEvery == 0 {
		opts.SweepEvery = DefaultSweepEvery
	}
	a := &Agent{loop: loop, pins: rt, opts: opts, cfg: &Config{}, fileOv: map[string]string{}, gone: map[string]time.Time{}, watching: make(chan struct{})}
	rt.OnForeign(a.foundForeign)
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

// foundForeign reports a record of a local name gpupin did not write:
// a pod that names the local name could have run an image this node
// never proved, and a mirror configured for every registry is the usual
// way it got there (gpupin detect says what to add to its filters).
func (a *Agent) foundForeign(r containerd.Recovered) {
	a.opts.Logger.Warn("foreign record of a node-local name: "+r.Detail, "key", r.Key, "ref", r.Ref,
		"hint", "a mirror that serves every registry serves other nodes' local names: add the local prefix to its registry filters (gpupin detect)")
	a.foreignMu.Lock()
	a.foreignN++
	a.foreign = append(a.foreign, ForeignRecord{At: time.Now().UTC(), Recovered: r})
	if len(a.foreign) > keptForeign {
		a.foreign = a.foreign[len(a.foreign)-keptForeign:]
	}
	m := a.metrics
	a.foreignMu.Unlock()
	if m != nil {
		m.foreign.Inc()
	}
}

// Foreign counts the foreign records of local names found since the agent
// started, and gives the last few.
func (a *Agent) Foreign() (int64, []ForeignRecord) {
	a.foreignMu.Lock()
	defer a.foreignMu.Unlock()
	return a.foreignN, append([]ForeignRecord(nil), a.foreign...)
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
	// One writer at a time, each from the statuses as they are when it
	// writes: a write from an older view landing last would put back a
	// label CheckPins just took away.
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	wrote, err := a.features.Sync(a.live(a.loop.Status()))
	switch {
	case err != nil:
		a.opts.Logger.Error("NFD feature file not written; node labels may be stale", "path", a.features.Path, "err", err)
	case wrote:
		a.opts.Logger.Info("NFD feature file written", "path", a.features.Path)
	}
}

// live leaves out the ready statuses whose pin CheckPins found gone, and
// forgets those the loop has reported anew since.
func (a *Agent) live(sts []provision.Status) []provision.Status {
	a.goneMu.Lock()
	defer a.goneMu.Unlock()
	out := make([]provision.Status, 0, len(sts))
	still := map[string]bool{}
	for _, st := range sts {
		if at, ok := a.gone[st.Key]; ok && st.State == provision.Ready && st.At.Equal(at) {
			still[st.Key] = true
			continue
		}
		out = append(out, st)
	}
	for k := range a.gone {
		if !still[k] {
			delete(a.gone, k)
		}
	}
	return out
}

// CheckPins looks, in containerd only (no registry), at every engine the
// loop reports ready: when its pin is no longer the key's pin (`gpupin
// unpin` beside the agent, or a pin another client took that could not be
// restored) or its local name is gone, the engine's NFD line goes at once
// (pods must not be scheduled onto a node that would fail them with
// ErrImageNeverPull) and the loop provisions it again now rather than at
// its next recheck. Maintain calls it every pass; it reports the keys it
// found gone.
func (a *Agent) CheckPins(ctx context.Context) []string {
	var ready []provision.Status
	for _, st := range a.loop.Status() {
		if st.State == provision.Ready && st.Pinned != "" {
			ready = append(ready, st)
		}
	}
	if len(ready) == 0 {
		return nil
	}
	pins, err := a.pins.ListPins(ctx) // Recover ran just before: reading is enough
	if err != nil {
		if ctx.Err() == nil {
			a.opts.Logger.Warn("checking the ready engines' pins failed", "err", err)
		}
		return nil
	}
	byKey := map[string]containerd.Pin{}
	for _, p := range pins {
		if !p.Tampered {
			byKey[p.Key] = p
		}
	}
	var gone []string
	for _, st := range ready {
		p, ok := byKey[st.Key]
		var why string
		switch {
		case !ok:
			why = "its pin is gone (unpinned, or removed by another client and not restorable)"
		case p.Ref != st.Pinned:
			why = "the key is pinned to " + p.Ref + " now"
		case st.Pin != nil && st.Pin.Local != "" && p.Local == "":
			why = "its local name " + st.Pin.Local + " is gone"
		default:
			continue
		}
		a.opts.Logger.Warn("ready engine lost its pin: node label removed, provisioning again", "key", st.Key, "pinned", st.Pinned, "why", why)
		if a.features != nil {
			a.goneMu.Lock()
			a.gone[st.Key] = st.At
			a.goneMu.Unlock()
		}
		gone = append(gone, st.Key)
	}
	if len(gone) == 0 {
		return nil
	}
	a.SyncFeatures()
	for _, k := range gone {
		a.loop.Recheck(k)
	}
	return gone
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
	maps.Copy(ov, a.clusterOv)
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
	a.mu.Lock()
	defer a.mu.Unlock()
	var o images.Override
	var err error
	if a.opts.OverridesPath != "" {
		var of *images.OverrideFile
		if o, of, err = images.SetOverride(a.opts.OverridesPath, engine, value); err == nil {
			a.fileOv = of.Overrides
		}
	} else {
		var parsed map[string]images.Override
		if parsed, err = images.ParseOverrides(map[string]string{engine: value}); err == nil {
			o = parsed[engine]
			a.fileOv = maps.Clone(a.fileOv)
			a.fileOv[engine] = o.String()
		}
	}
	var refused *images.Refusal
	switch {
	case errors.As(err, &refused):
		return OverrideSet{}, &InputError{err}
	case err != nil:
		return OverrideSet{}, fmt.Errorf("save override: %w", err)
	}
	if err := a.apply(); err != nil {
		return OverrideSet{}, err
	}
	named := a.loop.Engines()
	return OverrideSet{Override: o, Wanted: slices.Contains(named, engine), Named: named, Unnamed: a.loop.Unnamed()}, nil
}

// SetClusterOverrides replaces the overrides that come from the cluster
// (package fleet resolves them from EngineOverride objects): per engine,
// they win over the config's and the overrides file's, and an engine they
// no longer name falls back to those. A bad value changes nothing.
func (a *Agent) SetClusterOverrides(m map[string]string) error {
	if _, err := images.ParseOverrides(m); err != nil {
		return &InputError{err}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clusterOv = maps.Clone(m)
	return a.apply()
}

// FileOverrides are the overrides of the config and the overrides file,
// before the cluster's: what an engine falls back to.
func (a *Agent) FileOverrides() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ov := maps.Clone(a.cfg.Overrides)
	if ov == nil {
		ov = map[string]string{}
	}
	maps.Copy(ov, a.fileOv)
	return ov
}

// Status is the latest status of every wanted engine.
func (a *Agent) Status() []provision.Status { return a.loop.Status() }

// Pins lists the pins in containerd, wanted or not, as containerd holds
// them (the periodic pass restores what another client took).
func (a *Agent) Pins(ctx context.Context) ([]containerd.Pin, error) { return a.pins.ListPins(ctx) }
