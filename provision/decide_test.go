package provision

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// The decision on values alone: no runtime, registry or overrides file.
// Each case gives what has been read; decide says the plan, or what it
// must read next.

func decideFacts(driver, cuda string, simulated bool) *node.Facts {
	return &node.Facts{Driver: driver, CUDA: cuda, Platform: "linux/amd64", Simulated: simulated,
		GPUs: []node.GPU{{Index: 0, UUID: "GPU-h100", Name: "NVIDIA H100 80GB HBM3", Brand: "nvidia", CC: "9.0"}}}
}

func decideSet(ref string, variants ...string) *images.Set {
	s := &images.Set{Ref: ref, Repo: "reg/demo", Digest: "sha256:1111", MediaType: "application/vnd.oci.image.index.v1+json"}
	cuda := map[string]string{"cu13": "13.0", "cu129": "12.9"}
	for _, v := range variants {
		s.Variants = append(s.Variants, images.Variant{
			Metadata: images.Metadata{Engine: "demo", EngineVersion: "1.0", Variant: v, CUDA: cuda[v], Archs: "9.0", Probe: "cuda"},
			Ref:      "reg/demo@sha256:" + v, Digest: "sha256:" + v, Platform: "linux/amd64",
			MediaType: "application/vnd.oci.image.manifest.v1+json"})
	}
	return s
}

func TestDecide(t *testing.T) {
	const ref = "reg/demo:1.0"
	h100 := decideFacts("580.82.07", "13.0", false)
	h100sim := decideFacts("580.82.07", "13.0", true)
	h100old := decideFacts("575.57.08", "12.9", false)
	unsupported := &node.Facts{Platform: "linux/amd64", Unsupported: "no NVIDIA driver"}
	auto := map[string]applied{"demo": {images.Override{Kind: images.OverrideAuto}, OverrideFromDefault}}
	ov := func(s string) map[string]applied {
		o, err := images.ParseOverride(s)
		if err != nil {
			t.Fatal(err)
		}
		return map[string]applied{"demo": {o, OverrideFromSource}}
	}
	pin := func(facts *node.Facts, source, override string) containerd.Pin {
		return containerd.Pin{Key: "demo:1.0", Ref: "reg/demo@sha256:cu13", Variant: "cu13", Source: source,
			Override: override, Node: facts.Fingerprint(), Simulated: facts.Simulated, ProbedAt: time.Unix(0, 0)}
	}
	tampered := pin(h100, "other/demo:1.0", "auto")
	tampered.Tampered = true
	set := decideSet(ref, "cu13", "cu129")
	image := decideSet("reg.test/ops/demo:mine", "cu129")
	long := "reg/" + strings.Repeat("a", 70) + ":1.0" // an engine name of 70

	cases := []struct {
		name      string
		want      Want
		r         reads
		need      need
		outcome   string
		cands     []string
		rejected  []string
		class     error // the plan's Err
		source    string
		err       bool // decide's own error
		namedBy   string
		heldValue bool
	}{
		{name: "unsupported node reads nothing", want: Want{Ref: ref}, r: reads{facts: unsupported},
			outcome: OutcomeUnsupported, class: ErrUnsupported},
		{name: "no pin: the registry", want: Want{Ref: ref}, r: reads{facts: h100},
			need: need{kind: needSet}},
		{name: "a pin of the source: its engine's override first", want: Want{Ref: ref},
			r:    reads{facts: h100, pins: []containerd.Pin{pin(h100, ref, "auto")}},
			need: need{kind: needOverride, engine: "demo"}},
		{name: "installed wins: no registry", want: Want{Ref: ref},
			r:       reads{facts: h100, pins: []containerd.Pin{pin(h100, ref, "auto")}, overrides: auto},
			outcome: OutcomePinned},
		{name: "a pin proved on other GPUs does not answer", want: Want{Ref: ref},
			r:    reads{facts: h100old, pins: []containerd.Pin{pin(h100, ref, "auto")}, overrides: auto},
			need: need{kind: needSet}},
		{name: "a pin made on hardware does not answer a simulated node", want: Want{Ref: ref},
			r:       reads{facts: h100sim, pins: []containerd.Pin{pin(h100, ref, "auto")}, overrides: auto, set: set},
			outcome: OutcomeConflict, class: ErrConflict, heldValue: true},
		{name: "a pin under another override does not answer", want: Want{Ref: ref},
			r:       reads{facts: h100, pins: []containerd.Pin{pin(h100, ref, "auto")}, overrides: ov("cu129"), set: set},
			outcome: OutcomeReady, cands: []string{"cu129"}, heldValue: true},
		{name: "the want's own override needs no read", want: Want{Ref: ref, Override: "cu129"},
			r:       reads{facts: h100, set: set},
			outcome: OutcomeReady, cands: []string{"cu129"}},
		{name: "set read: the engine's override next", want: Want{Ref: ref},
			r:    reads{facts: h100, set: set},
			need: need{kind: needOverride, engine: "demo"}},
		{name: "auto on 580: newest CUDA first", want: Want{Ref: ref},
			r:       reads{facts: h100, set: set, overrides: auto},
			outcome: OutcomeReady, cands: []string{"cu13", "cu129"}, namedBy: NamedByMetadata},
		{name: "auto on 575: cu13 rejected", want: Want{Ref: ref},
			r:       reads{facts: h100old, set: set, overrides: auto},
			outcome: OutcomeReady, cands: []string{"cu129"}, rejected: []string{"cu13"}},
		{name: "none", want: Want{Ref: ref},
			r:       reads{facts: h100, set: set, overrides: ov("none")},
			outcome: OutcomeNone, class: ErrDisabled},
		{name: "none does not let a pin answer", want: Want{Ref: ref},
			r:       reads{facts: h100, pins: []containerd.Pin{pin(h100, ref, "none")}, set: set, overrides: ov("none")},
			outcome: OutcomeNone, class: ErrDisabled, heldValue: true},
		{name: "a forced variant that is not published", want: Want{Ref: ref, Override: "cu11"},
			r:       reads{facts: h100, set: set},
			outcome: OutcomeNoCandidate, class: ErrNoCandidate},
		{name: "another source holds the key named by metadata", want: Want{Ref: ref},
			r:       reads{facts: h100, pins: []containerd.Pin{pin(h100, "other/demo:1.0", "auto")}, set: set, overrides: auto},
			outcome: OutcomeConflict, class: ErrConflict, heldValue: true},
		{name: "a want naming its key takes it over", want: Want{Ref: ref, Engine: "demo", Version: "1.0"},
			r:       reads{facts: h100, pins: []containerd.Pin{pin(h100, "other/demo:1.0", "auto")}, set: set, overrides: auto},
			outcome: OutcomeReady, cands: []string{"cu13", "cu129"}, namedBy: NamedByWant, heldValue: true},
		{name: "a tampered record holds its key", want: Want{Ref: ref},
			r:       reads{facts: h100, pins: []containerd.Pin{tampered}, set: set, overrides: auto},
			outcome: OutcomeConflict, class: ErrConflict},
		{name: "an image override: its image next", want: Want{Ref: ref},
			r:    reads{facts: h100, set: set, overrides: ov("reg.test/ops/demo:mine")},
			need: need{kind: needImage, ref: "reg.test/ops/demo:mine"}},
		{name: "an image override chooses among its image's variants", want: Want{Ref: ref},
			r:       reads{facts: h100, set: set, overrides: ov("reg.test/ops/demo:mine"), image: image},
			outcome: OutcomeReady, cands: []string{"cu129"}, source: "reg.test/ops/demo:mine"},
		{name: "a named key with its own image never reads its reference", want: Want{Ref: ref, Engine: "demo", Version: "1.0", Override: "reg.test/ops/demo:mine"},
			r:    reads{facts: h100},
			need: need{kind: needImage, ref: "reg.test/ops/demo:mine"}},
		{name: "a key no pin can carry", want: Want{Ref: long},
			r:   reads{facts: h100, set: &images.Set{Ref: long}},
			err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := readWant(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			pl, n, err := decide(w, &tc.r, "")
			if tc.err {
				if !errors.Is(err, ErrInvalidWant) {
					t.Fatalf("decide: %v, plan %+v; want %v", err, pl, ErrInvalidWant)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.need {
				t.Fatalf("need %+v, want %+v", n, tc.need)
			}
			if tc.need.kind != needNothing {
				if pl != nil {
					t.Fatalf("a plan (%s) beside a need", pl.Outcome)
				}
				return
			}
			if pl.Outcome != tc.outcome {
				t.Fatalf("outcome %s (%s), want %s", pl.Outcome, pl.Detail, tc.outcome)
			}
			if got := candidateNames(pl); !slices.Equal(got, tc.cands) {
				t.Errorf("candidates %v, want %v", got, tc.cands)
			}
			var rejected []string
			for _, r := range pl.Rejected {
				rejected = append(rejected, r.Variant)
			}
			if !slices.Equal(rejected, tc.rejected) {
				t.Errorf("rejected %v, want %v", rejected, tc.rejected)
			}
			switch {
			case tc.class == nil && pl.Err != nil:
				t.Errorf("err %v, want none", pl.Err)
			case tc.class != nil && !errors.Is(pl.Err, tc.class):
				t.Errorf("err %v, want %v", pl.Err, tc.class)
			}
			if tc.source != "" && pl.Source != tc.source {
				t.Errorf("source %s, want %s", pl.Source, tc.source)
			}
			if tc.namedBy != "" && pl.NamedBy != tc.namedBy {
				t.Errorf("named by %s, want %s", pl.NamedBy, tc.namedBy)
			}
			if (pl.Held != nil) != tc.heldValue && pl.Outcome != OutcomePinned {
				t.Errorf("held %v, want held %v", pl.Held, tc.heldValue)
			}
			for _, c := range pl.Candidates {
				if c.Probe == "" {
					t.Errorf("candidate %s has no probe", c.Variant)
				}
			}
		})
	}
}

func candidateNames(pl *Plan) []string {
	var out []string
	for _, c := range pl.Candidates {
		out = append(out, c.Variant)
	}
	return out
}

// countingResolver and countingOverrides count what decideReading reads.
type countingResolver struct {
	sets  map[string]*images.Set
	reads map[string]int
}

func (c *countingResolver) ResolveReference(_ context.Context, ref images.Reference) (*images.Set, error) {
	c.reads[ref.String()]++
	if s, ok := c.sets[ref.String()]; ok {
		return s, nil
	}
	return nil, errors.New("not in the test's registry")
}

type countingOverrides struct {
	NotSettable
	m     map[string]string
	reads map[string]int
}

func (c *countingOverrides) Override(engine string) (images.Override, bool, error) {
	c.reads[engine]++
	s, ok := c.m[engine]
	if !ok {
		return images.Override{}, false, nil
	}
	o, err := images.ParseOverride(s)
	return o, true, err
}

// Each part of a decision is read at most once, and only when the
// decision needs it: a pin that answers asks nothing of the registry.
func TestDecideReadsEachPartOnce(t *testing.T) {
	const ref = "reg.test/demo:1.0"
	h100 := decideFacts("580.82.07", "13.0", false)
	answering := containerd.Pin{Key: "demo:1.0", Ref: "reg.test/demo@sha256:cu13", Variant: "cu13", Source: ref,
		Override: "auto", Node: h100.Fingerprint()}
	cases := []struct {
		name      string
		want      Want
		overrides map[string]string
		pins      []containerd.Pin
		outcome   string
		resolves  map[string]int
		read      []string // the engines whose override is read, once each
		resolving int
	}{
		{name: "pinned", pins: []containerd.Pin{answering}, outcome: OutcomePinned, resolves: map[string]int{}, read: []string{"demo"}},
		{name: "fresh", outcome: OutcomeReady, resolves: map[string]int{ref: 1}, read: []string{"demo"}, resolving: 1},
		{name: "image override", overrides: map[string]string{"demo": "reg.test/ops:mine"}, outcome: OutcomeReady,
			resolves: map[string]int{ref: 1, "reg.test/ops:mine": 1}, read: []string{"demo"}, resolving: 1},
		{name: "a named key's own image", want: Want{Ref: ref, Engine: "demo", Version: "1.0", Override: "reg.test/ops:mine"},
			outcome: OutcomeReady, resolves: map[string]int{"reg.test/ops:mine": 1}, resolving: 1},
		{name: "none", overrides: map[string]string{"demo": "none"}, pins: []containerd.Pin{answering}, outcome: OutcomeNone,
			resolves: map[string]int{ref: 1}, read: []string{"demo"}, resolving: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := &countingResolver{reads: map[string]int{}, sets: map[string]*images.Set{
				ref: decideSet(ref, "cu13", "cu129"), "reg.test/ops:mine": decideSet("reg.test/ops:mine", "cu129")}}
			ovs := &countingOverrides{m: tc.overrides, reads: map[string]int{}}
			p, err := New(nil, WithResolver(res), WithOverrides(ovs), WithNode(node.Static{Facts: h100}))
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Ref == "" {
				tc.want.Ref = ref
			}
			w, err := readWant(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			resolving := 0
			pl, err := p.decideReading(context.Background(), w, &reads{facts: h100, pins: tc.pins}, func() { resolving++ })
			if err != nil {
				t.Fatal(err)
			}
			if pl.Outcome != tc.outcome {
				t.Fatalf("outcome %s (%s), want %s", pl.Outcome, pl.Detail, tc.outcome)
			}
			for k, n := range res.reads {
				if n != tc.resolves[k] {
					t.Errorf("%s resolved %d times, want %d", k, n, tc.resolves[k])
				}
			}
			for k, n := range tc.resolves {
				if res.reads[k] != n {
					t.Errorf("%s resolved %d times, want %d", k, res.reads[k], n)
				}
			}
			if resolving != tc.resolving {
				t.Errorf("told resolving %d times, want %d", resolving, tc.resolving)
			}
			var read []string
			for engine, n := range ovs.reads {
				if n != 1 {
					t.Errorf("override of %s read %d times, want once", engine, n)
				}
				read = append(read, engine)
			}
			if slices.Sort(read); !slices.Equal(read, tc.read) {
				t.Errorf("overrides read of %v, want %v", read, tc.read)
			}
		})
	}
}
