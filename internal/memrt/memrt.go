// Package memrt is the fast tier's stand-in for containerd, for tests of
// the code above it (provision, agent): pins in a slice, pulls that fail
// where a test says, probe runs that print what a test says, and a
// registry's answer held in memory. It holds no behaviour a test claims of
// containerd (those tests run on a real daemon); it lets the logic above
// be checked in milliseconds, without one.
//
// *Runtime is all of agent.RunRuntime (and so provision.Runtime): the
// agent's tests check that at compile time.
package memrt

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// Runtime is containerd held in memory, safe for concurrent use: a test
// says how pulls and probes go (FailPull, SetProbe) and reads what
// happened (Pulled, Probed, Passes) while the code under test runs.
type Runtime struct {
	mu      sync.Mutex
	pins    []containerd.Pin
	pulls   []string // references, in order
	runs    []string
	sweeps  int
	recover int
	foreign func(containerd.Recovered)
	pullErr map[string]error  // by reference
	output  map[string]string // a probe's output, by image
	exit    map[string]int
}

// New is an empty runtime: no pins, every pull succeeds and every probe
// prints a passing verdict on the simulated H100 (testenv.H100).
func New() *Runtime {
	return &Runtime{pullErr: map[string]error{}, output: map[string]string{}, exit: map[string]int{}}
}

// FailPull makes pulls of ref fail with err; nil: succeed again.
func (m *Runtime) FailPull(ref string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		delete(m.pullErr, ref)
		return
	}
	m.pullErr[ref] = err
}

// SetProbe makes a probe in image print output and exit with code.
func (m *Runtime) SetProbe(image, output string, code int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.output[image], m.exit[image] = output, code
}

var _ provision.Runtime = (*Runtime)(nil)

// Pins lists the pins (nothing to restore in memory).
func (m *Runtime) Pins(ctx context.Context) ([]containerd.Pin, error) { return m.ListPins(ctx) }

// ListPins lists the pins.
func (m *Runtime) ListPins(context.Context) ([]containerd.Pin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.pins), nil
}

// PreviousPins lists none.
func (m *Runtime) PreviousPins(context.Context) ([]containerd.Pin, error) { return nil, nil }

// SetPin keeps one pin a key, and refuses another source's without
// Takeover, as containerd's does.
func (m *Runtime) SetPin(_ context.Context, p containerd.Pin, opts containerd.SetPinOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, old := range m.pins {
		if old.Key != p.Key {
			continue
		}
		if old.Source != p.Source && !opts.Takeover {
			return &containerd.HeldError{Key: p.Key, Ref: old.Ref, Source: old.Source, Claimed: p.Source}
		}
		m.pins[i] = p
		return nil
	}
	m.pins = append(m.pins, p)
	return nil
}

// Unpin removes the key's pin, as an operator's `gpupin unpin` would;
// false: there was none.
func (m *Runtime) Unpin(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.pins)
	m.pins = slices.DeleteFunc(m.pins, func(p containerd.Pin) bool { return p.Key == key })
	return len(m.pins) != n
}

// DiscardCandidate does nothing: nothing was staged.
func (m *Runtime) DiscardCandidate(context.Context, string) error { return nil }

// WithLease runs fn.
func (m *Runtime) WithLease(ctx context.Context, fn func(context.Context) error) error {
	return fn(ctx)
}

// Pull records ref and fails it as PullErr says.
func (m *Runtime) Pull(_ context.Context, ref string, _ containerd.PullOptions) (containerd.Pulled, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pulls = append(m.pulls, ref)
	if err := m.pullErr[ref]; err != nil {
		return containerd.Pulled{}, err
	}
	_, digest, _ := strings.Cut(ref, "@")
	return containerd.Pulled{Name: ref, Digest: digest, Created: true}, nil
}

// Registry is none: manifests come from the test's Resolver.
func (m *Runtime) Registry() *registry.Policy { return nil }

// Prefetch does nothing.
func (m *Runtime) Prefetch(context.Context, string, containerd.PullOptions, int64) (func(), error) {
	return func() {}, nil
}

// ImageConfig is an empty config.
func (m *Runtime) ImageConfig(context.Context, string, string) (ocispec.ImageConfig, error) {
	return ocispec.ImageConfig{}, nil
}

// Run is a probe run: it prints the output set for the image, else a
// passing verdict on the simulated H100.
func (m *Runtime) Run(_ context.Context, spec containerd.RunSpec) (containerd.RunResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runs = append(m.runs, spec.Image)
	out, ok := m.output[spec.Image]
	if !ok {
		out = Passing()
	}
	return containerd.RunResult{Output: []byte(out), ExitCode: m.exit[spec.Image]}, nil
}

// Sweep finds nothing to sweep.
func (m *Runtime) Sweep(context.Context) (containerd.Swept, error) { return containerd.Swept{}, nil }

// SweepOrphans counts the sweep and finds nothing.
func (m *Runtime) SweepOrphans(context.Context) (containerd.Swept, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweeps++
	return containerd.Swept{}, nil
}

// Recover counts the pass; nothing was taken, so nothing is restored.
func (m *Runtime) Recover(context.Context) ([]containerd.Recovered, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recover++
	return nil, nil
}

// OnForeign keeps f: Foreign hands it a record.
func (m *Runtime) OnForeign(f func(containerd.Recovered)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.foreign = f
}

// Foreign tells the OnForeign callback of r, as a recovery that found a
// record of a local name gpupin did not write would; false: none is set.
func (m *Runtime) Foreign(r containerd.Recovered) bool {
	m.mu.Lock()
	f := m.foreign
	m.mu.Unlock()
	if f == nil {
		return false
	}
	f(r)
	return true
}

// Namespace is "mem".
func (m *Runtime) Namespace() string { return "mem" }

// LocalPrefix is the node-local names' prefix.
func (m *Runtime) LocalPrefix() string { return "gpupin.local" }

// CRIPinning says nothing is known of a CRI plugin.
func (m *Runtime) CRIPinning(context.Context) (containerd.CRIPinning, error) {
	return containerd.CRIPinning{Version: "memrt", Note: "in memory: no CRI plugin"}, nil
}

// LocalNames has no hosts configuration to warn of.
func (m *Runtime) LocalNames(context.Context) (containerd.LocalNames, error) {
	return containerd.LocalNames{}, nil
}

// LayerStorage says layers are held nowhere.
func (m *Runtime) LayerStorage(context.Context) (containerd.LayerStorage, error) {
	return containerd.LayerStorage{Summary: "in memory: no layers"}, nil
}

// Pulled is the references pulled, in order.
func (m *Runtime) Pulled() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.pulls)
}

// Probed is the images probed, in order.
func (m *Runtime) Probed() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.runs)
}

// Passes counts the periodic passes' calls: sweeps (SweepOrphans) and
// recoveries (Recover).
func (m *Runtime) Passes() (sweeps, recoveries int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sweeps, m.recover
}

// VerdictLine is a probe's verdict as it prints it.
func VerdictLine(v probe.Verdict) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return "probing…\n" + probe.LinePrefix + string(b) + "\n"
}

// Passing is the verdict of a probe that computed on the simulated H100.
func Passing() string {
	return VerdictLine(probe.Verdict{OK: true, Devices: []probe.Device{{Index: 0, UUID: testenv.H100UUID, Name: "NVIDIA H100 80GB HBM3", CC: "9.0", TFLOPS: 400}},
		SimulatedChecks: []string{"gemm"}})
}

// Resolver is a registry's answer held in memory: a set per reference.
type Resolver map[string]*images.Set

// ResolveReference is the set published under ref.
func (r Resolver) ResolveReference(_ context.Context, ref images.Reference) (*images.Set, error) {
	if s, ok := r[ref.String()]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("%s: not found in the test's registry", ref)
}

// EngineSet is ref published as cu13 and cu129 variants of engine:version,
// the way `gpupin publish` annotates them.
func EngineSet(ref, engine, version string) *images.Set {
	repo, _, _ := strings.Cut(ref, ":")
	variant := func(name, cuda, driver, digest string) images.Variant {
		return images.Variant{Metadata: images.Metadata{Engine: engine, EngineVersion: version, Variant: name, CUDA: cuda, DriverMin: driver, Archs: "8.0,9.0"},
			Ref: repo + "@sha256:" + strings.Repeat(digest, 64), Digest: "sha256:" + strings.Repeat(digest, 64), MediaType: ocispec.MediaTypeImageManifest, Platform: "linux/amd64"}
	}
	return &images.Set{Ref: ref, Repo: repo, MediaType: ocispec.MediaTypeImageIndex,
		Variants: []images.Variant{variant("cu13", "13.0", "580.65.06", "a"), variant("cu129", "12.9", "575.51.03", "b")}}
}
