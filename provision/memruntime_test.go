package provision_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// memRuntime is the fast tier's stand-in for containerd: pins in a slice,
// pulls that fail where a test says, and probe runs that print what a test
// says. It holds no behaviour a test claims of containerd (those tests run
// on a real daemon); it lets plan, fallback order, override precedence,
// loop backoff and verdict judging be checked in milliseconds.
type memRuntime struct {
	mu      sync.Mutex
	pins    []containerd.Pin
	pullErr map[string]error  // by reference
	output  map[string]string // a probe's output, by reference
	exit    map[string]int
	pulls   []string // references, in order
	runs    []string
}

func newMemRuntime() *memRuntime {
	return &memRuntime{pullErr: map[string]error{}, output: map[string]string{}, exit: map[string]int{}}
}

var _ provision.Runtime = (*memRuntime)(nil)

func (m *memRuntime) Pins(ctx context.Context) ([]containerd.Pin, error) { return m.ListPins(ctx) }

func (m *memRuntime) ListPins(context.Context) ([]containerd.Pin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.pins), nil
}

func (m *memRuntime) PreviousPins(context.Context) ([]containerd.Pin, error) { return nil, nil }

// SetPin keeps one pin a key, and refuses another source's without
// Takeover, as containerd's does.
func (m *memRuntime) SetPin(_ context.Context, p containerd.Pin, opts containerd.SetPinOptions) error {
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

func (m *memRuntime) DiscardCandidate(context.Context, string) error { return nil }

func (m *memRuntime) WithLease(ctx context.Context, fn func(context.Context) error) error {
	return fn(ctx)
}

func (m *memRuntime) Pull(_ context.Context, ref string, _ containerd.PullOptions) (containerd.Pulled, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pulls = append(m.pulls, ref)
	if err := m.pullErr[ref]; err != nil {
		return containerd.Pulled{}, err
	}
	_, digest, _ := strings.Cut(ref, "@")
	return containerd.Pulled{Name: ref, Digest: digest, Created: true}, nil
}

func (m *memRuntime) Registry() *registry.Policy { return nil }

func (m *memRuntime) Prefetch(context.Context, string, containerd.PullOptions, int64) (func(), error) {
	return func() {}, nil
}

func (m *memRuntime) ImageConfig(context.Context, string, string) (ocispec.ImageConfig, error) {
	return ocispec.ImageConfig{}, nil
}

// Run is a probe run: it prints the output set for the image, else a
// passing verdict on the simulated H100.
func (m *memRuntime) Run(_ context.Context, spec containerd.RunSpec) (containerd.RunResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runs = append(m.runs, spec.Image)
	out, ok := m.output[spec.Image]
	if !ok {
		out = passing()
	}
	return containerd.RunResult{Output: []byte(out), ExitCode: m.exit[spec.Image]}, nil
}

func (m *memRuntime) Sweep(context.Context) (containerd.Swept, error) { return containerd.Swept{}, nil }
func (m *memRuntime) Namespace() string                               { return "mem" }

func (m *memRuntime) pulled() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.pulls)
}

// verdictLine is a probe's verdict as it prints it.
func verdictLine(v probe.Verdict) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return "probing…\n" + probe.LinePrefix + string(b) + "\n"
}

// passing is the verdict of a probe that computed on the simulated H100.
func passing() string {
	return verdictLine(probe.Verdict{OK: true, Devices: []probe.Device{{Index: 0, UUID: testenv.H100UUID, Name: "NVIDIA H100 80GB HBM3", CC: "9.0", TFLOPS: 400}},
		SimulatedChecks: []string{"gemm"}})
}

// memResolver is a registry's answer held in memory: a set per reference.
type memResolver map[string]*images.Set

func (r memResolver) ResolveReference(_ context.Context, ref images.Reference) (*images.Set, error) {
	if s, ok := r[ref.String()]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("%s: not found in the test's registry", ref)
}

// engineSet is ref published as cu13 and cu129 variants of engine:version,
// the way `gpupin publish` annotates them.
func engineSet(ref, engine, version string) *images.Set {
	repo, _, _ := strings.Cut(ref, ":")
	variant := func(name, cuda, driver, digest string) images.Variant {
		return images.Variant{Metadata: images.Metadata{Engine: engine, EngineVersion: version, Variant: name, CUDA: cuda, DriverMin: driver, Archs: "8.0,9.0"},
			Ref: repo + "@sha256:" + strings.Repeat(digest, 64), Digest: "sha256:" + strings.Repeat(digest, 64), MediaType: ocispec.MediaTypeImageManifest, Platform: "linux/amd64"}
	}
	return &images.Set{Ref: ref, Repo: repo, MediaType: ocispec.MediaTypeImageIndex,
		Variants: []images.Variant{variant("cu13", "13.0", "580.65.06", "a"), variant("cu129", "12.9", "575.51.03", "b")}}
}

// memProvisioner is a Provisioner over m and sets on the simulated H100,
// with stand-in probe programs (the probe never runs them: m prints).
func memProvisioner(t *testing.T, m *memRuntime, sets memResolver, facts *node.Facts, extra ...provision.Option) *provision.Provisioner {
	t.Helper()
	dir := t.TempDir()
	bin := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	opts := []provision.Option{provision.WithNode(node.Static{Facts: facts}), provision.WithResolver(sets),
		provision.WithOverrides(provision.NoOverrides()), provision.WithLockDir(filepath.Join(dir, "locks")),
		provision.WithProbeDir(filepath.Join(dir, "probe")), provision.WithCUDAProbe(bin("gpupin-cuda-probe")),
		provision.WithSimProbe(bin("gpupin-sim-probe"))}
	return testenv.Provisioner(t, m, append(opts, extra...)...)
}
