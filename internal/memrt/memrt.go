// Package memrt is the fast tier's stand-in for containerd, for tests of
// the code above it (provision, agent): image records, pins and their
// recovery in maps, pulls that fail where a test says, probe runs that
// print what a test says, and a registry's answer held in memory. Its pin
// store is held to containerd's by internal/runtimetest.Conformance, which
// runs the same cases on a real daemon; anything else a test claims of
// containerd runs on one. It lets the logic above be checked in
// milliseconds, without a daemon.
//
// *Runtime is all of agent.RunRuntime (and so provision.Runtime): the
// agent's tests check that at compile time.
package memrt

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
	"time"

	"github.com/containerd/errdefs"
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
//
// Its pin store keeps image records, the content they point at and each
// key's proof, as containerd's does (containerd/pins), so that what
// internal/runtimetest.Conformance holds containerd to, it holds here too:
// a held key, previous pins, candidates, and recovery of a pin whose
// record another client deleted.
type Runtime struct {
	mu      sync.Mutex
	records map[string]*record        // image records, by name
	content map[string]bool           // the digests whose content is there
	proofs  map[string]containerd.Pin // the pin each key's proof names, by key
	locals  map[string]string         // the node-local name of each key's pin
	clock   time.Time                 // containerd's: every write is later than the last
	pulls   []string                  // references, in order
	runs    []string
	sweeps  int
	recover int
	foreign func(containerd.Recovered)
	pullErr map[string]error  // by reference
	output  map[string]string // a probe's output, by image
	exit    map[string]int
}

// record is an image record: a candidate a pull made, or a pin (current,
// or previous) with its labels.
type record struct {
	name, digest string
	candidate    bool
	pin          *containerd.Pin
	updated      time.Time
}

// New is an empty runtime: no pins, every pull succeeds and every probe
// prints a passing verdict on the simulated H100 (testenv.H100).
func New() *Runtime {
	return &Runtime{records: map[string]*record{}, content: map[string]bool{}, proofs: map[string]containerd.Pin{}, locals: map[string]string{},
		pullErr: map[string]error{}, output: map[string]string{}, exit: map[string]int{}}
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

// AddPin makes p a pin as if an earlier provision had: its record, its
// content and its proof, with no pull or probe.
func (m *Runtime) AddPin(p containerd.Pin) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, d, _ := strings.Cut(p.Ref, "@")
	if p.Digest != "" {
		d = p.Digest
	}
	m.records[p.Ref] = &record{name: p.Ref, digest: d}
	m.content[d] = true
	m.setPin(m.records[p.Ref], p)
}

// Has reports whether an image record of that name exists: an image, or
// a pin's node-local name.
func (m *Runtime) Has(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.locals {
		if l == name {
			return true
		}
	}
	return m.records[name] != nil
}

// DeleteRecord deletes the image record as another client of containerd
// would (kubelet's image GC, crictl rmi); its content stays, as a pin's
// lease keeps it.
func (m *Runtime) DeleteRecord(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.records, name)
}

// Relabel replaces the record's labels as another client's pull of the
// name would (ctr pull, kubelet): it is no pin, and no candidate, until
// recovery puts the labels back.
func (m *Runtime) Relabel(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.records[name]; r != nil {
		r.pin, r.candidate, r.updated = nil, false, m.now()
	}
}

// LoseImage deletes the record and its content: nothing is left to
// restore it from.
func (m *Runtime) LoseImage(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.records[name]; r != nil {
		delete(m.content, r.digest)
	}
	delete(m.records, name)
}

var _ provision.Runtime = (*Runtime)(nil)

// now is the clock's next tick: later than every write before it.
func (m *Runtime) now() time.Time {
	t := time.Now().UTC()
	if !t.After(m.clock) {
		t = m.clock.Add(time.Nanosecond)
	}
	m.clock = t
	return t
}

// Pins lists the pins, recovering first, as containerd's does.
func (m *Runtime) Pins(context.Context) ([]containerd.Pin, error) {
	m.mu.Lock()
	done := m.recoverLocked()
	pins, f := m.listLocked(), m.foreign
	m.mu.Unlock()
	tell(f, done)
	return pins, nil
}

// tell hands f the foreign records among done, as containerd's
// OnForeign callback hears of them.
func tell(f func(containerd.Recovered), done []containerd.Recovered) {
	for _, d := range done {
		if f != nil && d.Action == "foreign" {
			f(d)
		}
	}
}

// ListPins lists the pins as held now: it only reads.
func (m *Runtime) ListPins(context.Context) ([]containerd.Pin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.listLocked(), nil
}

// current is the key's pin record (the newest written), or nil.
func (m *Runtime) current(key string) *record {
	var best *record
	for _, r := range m.records {
		if r.pin == nil || r.pin.Previous || r.pin.Key != key {
			continue
		}
		if best == nil || r.updated.After(best.updated) || (r.updated.Equal(best.updated) && r.name > best.name) {
			best = r
		}
	}
	return best
}

func (m *Runtime) listLocked() []containerd.Pin {
	keys := map[string]bool{}
	for _, r := range m.records {
		if r.pin != nil && !r.pin.Previous {
			keys[r.pin.Key] = true
		}
	}
	out := make([]containerd.Pin, 0, len(keys))
	for k := range keys {
		r := m.current(k)
		p := *r.pin
		p.UpdatedAt = r.updated
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b containerd.Pin) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// PreviousPins lists the records kept for rollback.
func (m *Runtime) PreviousPins(context.Context) ([]containerd.Pin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []containerd.Pin
	for _, r := range m.records {
		if r.pin != nil && r.pin.Previous {
			p := *r.pin
			p.UpdatedAt = r.updated
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b containerd.Pin) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// SetPin makes p.Ref, a record that is there, the pin of p.Key. It
// refuses another source's key without Takeover; the pin it replaces
// becomes the previous one, and an older previous is let go, as
// containerd's does.
func (m *Runtime) SetPin(_ context.Context, p containerd.Pin, opts containerd.SetPinOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.records[p.Ref]
	switch {
	case rec == nil:
		return fmt.Errorf("pin %s: image record %s: %w", p.Key, p.Ref, errdefs.ErrNotFound)
	case p.Digest != "" && p.Digest != rec.digest:
		return fmt.Errorf("pin %s: %s points at %s, but %s was probed", p.Key, p.Ref, rec.digest, p.Digest)
	case rec.pin != nil && !rec.pin.Previous && rec.pin.Key != p.Key:
		return fmt.Errorf("pin %s: %s is already the pin of %s; one image record holds one pin", p.Key, p.Ref, rec.pin.Key)
	}
	if !opts.Takeover {
		for _, o := range m.records {
			if o.pin != nil && !o.pin.Previous && o.pin.Key == p.Key && o.name != p.Ref && o.pin.Source != p.Source {
				return &containerd.HeldError{Key: p.Key, Ref: o.name, Source: o.pin.Source, Claimed: p.Source}
			}
		}
	}
	m.setPin(rec, p)
	return nil
}

// setPin labels rec as the key's pin, writes its proof and demotes the
// key's other records.
func (m *Runtime) setPin(rec *record, p containerd.Pin) {
	p.Digest, p.Previous, p.Tampered, p.Restored = rec.digest, false, false, time.Time{}
	p.Local = containerd.DefaultLocalPrefix + "/" + p.Key
	rec.pin, rec.candidate, rec.updated = &p, false, m.now()
	m.proofs[p.Key] = p
	m.locals[p.Key] = p.Local
	for _, o := range m.records {
		if o != rec && o.pin != nil && !o.pin.Previous && o.pin.Key == p.Key {
			m.demote(o)
		}
	}
	// One previous is kept for rollback: the newest.
	var prev []*record
	for _, o := range m.records {
		if o.pin != nil && o.pin.Previous && o.pin.Key == p.Key {
			prev = append(prev, o)
		}
	}
	slices.SortFunc(prev, func(a, b *record) int { return b.updated.Compare(a.updated) })
	for _, o := range prev[min(1, len(prev)):] {
		o.pin = nil
	}
}

// demote makes r a previous pin: the labels that say how it was proved
// stay, the key's local name goes.
func (m *Runtime) demote(r *record) {
	p := *r.pin
	p.Previous, p.Local, p.Restored = true, "", time.Time{}
	r.pin, r.updated = &p, m.now()
}

// Unpin removes the pin of key (the record stays, as a previous pin) and
// its proof, so nothing restores it; not found when there is neither.
func (m *Runtime) Unpin(_ context.Context, key string) (*containerd.Pin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	proof, proved := m.proofs[key]
	cur := m.current(key)
	if cur == nil && !proved {
		return nil, fmt.Errorf("unpin %s: %w", key, errdefs.ErrNotFound)
	}
	p := proof
	if cur != nil {
		p = *cur.pin
		p.Local = ""
	}
	delete(m.proofs, key)
	delete(m.locals, key)
	for _, r := range m.records {
		if r.pin != nil && !r.pin.Previous && r.pin.Key == key {
			m.demote(r)
		}
	}
	return &p, nil
}

// DiscardCandidate removes a record a pull made for a candidate that did
// not pass; never a pin, never a record of another kind.
func (m *Runtime) DiscardCandidate(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.records[name]; r != nil && r.candidate && r.pin == nil {
		delete(m.records, name)
	}
	return nil
}

// WithLease runs fn.
func (m *Runtime) WithLease(ctx context.Context, fn func(context.Context) error) error {
	return fn(ctx)
}

// Pull records ref and fails it as FailPull says. A pull makes a
// candidate's record, or answers from the record already there (a pin,
// perhaps) without making one (Created false), as containerd's does.
func (m *Runtime) Pull(_ context.Context, ref string, _ containerd.PullOptions) (containerd.Pulled, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pulls = append(m.pulls, ref)
	if err := m.pullErr[ref]; err != nil {
		return containerd.Pulled{}, err
	}
	if r := m.records[ref]; r != nil {
		return containerd.Pulled{Name: ref, Digest: r.digest}, nil
	}
	_, digest, _ := strings.Cut(ref, "@")
	m.records[ref] = &record{name: ref, digest: digest, candidate: true, updated: m.now()}
	m.content[digest] = true
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

// Recover counts the pass and restores what recoverLocked restores.
func (m *Runtime) Recover(context.Context) ([]containerd.Recovered, error) {
	m.mu.Lock()
	m.recover++
	done, f := m.recoverLocked(), m.foreign
	m.mu.Unlock()
	tell(f, done)
	return done, nil
}

// recoverLocked puts back a pin another client took: its labels on a
// record pulled over, its record while its content remains. A pin whose content went too is not
// restored: its proof and local name go, and the engine is proved again;
// containerd's store reports that local name cleared, as this does.
func (m *Runtime) recoverLocked() []containerd.Recovered {
	keys := make([]string, 0, len(m.proofs))
	for k := range m.proofs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []containerd.Recovered
	for _, key := range keys {
		p := m.proofs[key]
		if cur := m.current(key); cur != nil && cur.name == p.Ref {
			continue
		}
		if r := m.records[p.Ref]; r != nil && r.pin == nil && r.digest == p.Digest {
			m.setPin(r, p)
			r.pin.Restored = r.updated.Truncate(time.Second)
			out = append(out, containerd.Recovered{Key: key, Ref: p.Ref, Action: "relabelled", Detail: "a pull by another client had replaced its labels"})
			continue
		}
		if m.records[p.Ref] == nil && m.content[p.Digest] {
			rec := &record{name: p.Ref, digest: p.Digest}
			m.records[p.Ref] = rec
			m.setPin(rec, p)
			rec.pin.Restored = rec.updated.Truncate(time.Second)
			out = append(out, containerd.Recovered{Key: key, Ref: p.Ref, Action: "recreated",
				Detail: "its record had been deleted (kubelet's image GC, crictl rmi); its content remained"})
			continue
		}
		delete(m.proofs, key)
		if m.records[p.Ref] != nil {
			// Demoted, or another key's pin now: never restored.
			out = append(out, containerd.Recovered{Key: key, Ref: p.Ref, Action: "dropped", Detail: "its record is no longer this pin's"})
			continue
		}
		if l, ok := m.locals[key]; ok {
			delete(m.locals, key)
			out = append(out, containerd.Recovered{Key: key, Ref: l, Action: "cleared", Detail: "no pin: its local name is removed"})
		}
	}
	return out
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

// Staged is what a provisioner over memrt needs of the host: a lock and a
// probe directory of a test's own, and probe programs that are there (a
// provision checks they are before it pulls; memrt never runs them).
func Staged(t testing.TB) []provision.Option {
	t.Helper()
	dir := t.TempDir()
	bin := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return []provision.Option{provision.WithLockDir(filepath.Join(dir, "locks")), provision.WithProbeDir(filepath.Join(dir, "probe")),
		provision.WithCUDAProbe(bin("gpupin-cuda-probe")), provision.WithSimProbe(bin("gpupin-sim-probe"))}
}
