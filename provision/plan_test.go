package provision_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// The fast tier (go test -short): Plan on memrt.Runtime and memrt.Resolver.

const demoRef = "registry.test/org/demo:1.0"

func candidateNames(pl *provision.Plan) []string {
	var out []string
	for _, c := range pl.Candidates {
		out = append(out, c.Variant)
	}
	return out
}

func TestPlanOrdersVariantsForTheNodeSimulated(t *testing.T) {
	sets := memrt.Resolver{demoRef: memrt.EngineSet(demoRef, "demo", "1.0")}
	for _, tc := range []struct {
		name     string
		facts    *node.Facts
		outcome  string
		want     []string
		rejected []string
		err      error
	}{
		{"driver 580 runs both, newest CUDA first", h100("580.82.07", "13.0"), images.OutcomeReady, []string{"cu13", "cu129"}, nil, nil},
		{"driver 575 runs cu129 only", h100("575.57.08", "12.9"), images.OutcomeReady, []string{"cu129"}, []string{"cu13"}, nil},
		{"driver 550 runs neither", h100("550.54.15", "12.4"), images.OutcomeNoCandidate, nil, []string{"cu13", "cu129"}, provision.ErrNoCandidate},
		{"no driver", &node.Facts{Platform: "linux/amd64", Unsupported: "no NVIDIA driver"}, images.OutcomeUnsupported, nil, nil, provision.ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := memProvisioner(t, memrt.New(), sets, tc.facts)
			pl, err := p.Plan(t.Context(), provision.Want{Ref: demoRef})
			if err != nil {
				t.Fatal(err)
			}
			var rejected []string
			for _, r := range pl.Rejected {
				rejected = append(rejected, r.Variant)
			}
			if pl.Outcome != tc.outcome || !slices.Equal(candidateNames(pl), tc.want) || !slices.Equal(rejected, tc.rejected) {
				t.Fatalf("plan: %s, candidates %v, rejected %v; want %s, %v, %v", pl.Outcome, candidateNames(pl), rejected, tc.outcome, tc.want, tc.rejected)
			}
			if (tc.err == nil) != (pl.Err == nil) || (tc.err != nil && !errors.Is(pl.Err, tc.err)) {
				t.Fatalf("plan error %v, want %v", pl.Err, tc.err)
			}
			if tc.outcome == images.OutcomeReady && (pl.Key != "demo:1.0" || pl.NamedBy != provision.NamedByMetadata) {
				t.Fatalf("key %s named by %s, want demo:1.0 by metadata", pl.Key, pl.NamedBy)
			}
		})
	}
}

// The want's override, else the operator's for the engine, else auto.
func TestPlanOverridePrecedenceSimulated(t *testing.T) {
	custom := "registry.test/org/demo-custom:1"
	sets := memrt.Resolver{demoRef: memrt.EngineSet(demoRef, "demo", "1.0"), custom: memrt.EngineSet(custom, "demo", "1.0")}
	for _, tc := range []struct {
		name      string
		want      string // the want's override
		operator  string // the operator's, for engine demo
		override  string
		from      string
		outcome   string
		variants  []string
		source    string
		errorKind error
	}{
		{"neither: auto", "", "", "auto", provision.OverrideFromDefault, images.OutcomeReady, []string{"cu13", "cu129"}, demoRef, nil},
		{"the operator's", "", "cu129", "cu129", provision.OverrideFromSource, images.OutcomeReady, []string{"cu129"}, demoRef, nil},
		{"the want's over the operator's", "cu13", "cu129", "cu13", provision.OverrideFromWant, images.OutcomeReady, []string{"cu13"}, demoRef, nil},
		{"the want's auto over the operator's none", "auto", "none", "auto", provision.OverrideFromWant, images.OutcomeReady, []string{"cu13", "cu129"}, demoRef, nil},
		{"the operator's none", "", "none", "none", provision.OverrideFromSource, images.OutcomeNone, nil, demoRef, provision.ErrDisabled},
		{"the operator's image", "", custom, custom, provision.OverrideFromSource, images.OutcomeReady, []string{"cu13", "cu129"}, custom, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ov := provision.NewOverrides()
			if tc.operator != "" {
				if err := ov.Replace(map[string]string{"demo": tc.operator}); err != nil {
					t.Fatal(err)
				}
			}
			p := memProvisioner(t, memrt.New(), sets, h100("580.82.07", "13.0"), provision.WithOverrides(ov))
			pl, err := p.Plan(t.Context(), provision.Want{Ref: demoRef, Override: tc.want})
			if err != nil {
				t.Fatal(err)
			}
			if pl.Override != tc.override || pl.OverrideFrom != tc.from || pl.Outcome != tc.outcome || pl.Source != tc.source || !slices.Equal(candidateNames(pl), tc.variants) {
				t.Fatalf("override %s from %s, %s, source %s, candidates %v; want %s from %s, %s, %s, %v",
					pl.Override, pl.OverrideFrom, pl.Outcome, pl.Source, candidateNames(pl), tc.override, tc.from, tc.outcome, tc.source, tc.variants)
			}
			if tc.errorKind != nil && !errors.Is(pl.Err, tc.errorKind) {
				t.Fatalf("plan error %v, want %v", pl.Err, tc.errorKind)
			}
		})
	}
}

// Installed wins: a pin proved on this node, under the override that
// applies now, answers without the registry; another override, or another
// node, does not.
func TestPlanPinAnswersWithoutTheRegistrySimulated(t *testing.T) {
	facts := h100("580.82.07", "13.0")
	pin := containerd.Pin{Key: "demo:1.0", Ref: "registry.test/org/demo@sha256:" + strings.Repeat("a", 64), Variant: "cu13", Source: demoRef,
		Override: "auto", Node: facts.Fingerprint(), ProbedAt: time.Now(), Simulated: true}
	for _, tc := range []struct {
		name    string
		want    provision.Want
		node    *node.Facts
		outcome string
	}{
		{"the pin answers", provision.Want{Ref: demoRef}, facts, provision.OutcomePinned},
		{"another override", provision.Want{Ref: demoRef, Override: "cu129"}, facts, "registry"},
		{"another driver", provision.Want{Ref: demoRef}, h100("575.57.08", "12.9"), "registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memrt.New()
			m.AddPin(pin)
			// No sets: a plan that reads the registry fails, and says so.
			p := memProvisioner(t, m, memrt.Resolver{}, tc.node)
			pl, err := p.Plan(t.Context(), tc.want)
			switch {
			case tc.outcome == "registry" && (err == nil || !strings.Contains(err.Error(), "not found in the test's registry")):
				t.Fatalf("plan %v (err %v); want the registry read (and finding nothing)", pl, err)
			case tc.outcome != "registry" && (err != nil || pl.Outcome != tc.outcome || pl.Pinned == nil || pl.Pinned.Key != pin.Key):
				t.Fatalf("plan %v (err %v), want %s by %s", pl, err, tc.outcome, pin.Key)
			}
		})
	}
}

// A want that does not read is refused before anything is asked, through
// Plan, Provision and a Loop's SetWants alike.
func TestPlanRefusesAWantThatDoesNotReadSimulated(t *testing.T) {
	for _, w := range []provision.Want{
		{Ref: ""},
		{Ref: "Registry.test/UPPER:1"},
		{Ref: demoRef, Override: "not an override!"},
		{Ref: demoRef, Engine: "Demo"},
		{Ref: demoRef, Engine: "demo", Version: "1.0 beta"},
	} {
		m := memrt.New()
		p := memProvisioner(t, m, memrt.Resolver{}, h100("580.82.07", "13.0"))
		if _, err := p.Plan(t.Context(), w); !errors.Is(err, provision.ErrInvalidWant) {
			t.Errorf("Plan(%+v): %v, want ErrInvalidWant", w, err)
		}
		if st := p.Provision(t.Context(), w); st.State != provision.Failed || !errors.Is(st.Err, provision.ErrInvalidWant) {
			t.Errorf("Provision(%+v): %s, want failed with ErrInvalidWant", w, st)
		}
		if err := provision.NewLoop(p, provision.LoopOptions{}).SetWants([]provision.Want{w}); !errors.Is(err, provision.ErrInvalidWant) {
			t.Errorf("SetWants(%+v): %v, want ErrInvalidWant", w, err)
		}
		if len(m.Pulled()) != 0 {
			t.Errorf("%+v: pulled %v", w, m.Pulled())
		}
	}
}
