package provision_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/provision"
)

// stubCanary answers Await with a set verdict (package canary's Gate is
// tested against a real kube-apiserver in canary/).
type stubCanary struct {
	mu      sync.Mutex
	classes []string
	v       provision.CanaryVerdict
	err     error
	done    chan struct{} // closed by done, when this node is the canary
}

func (c *stubCanary) Await(ctx context.Context, class, key string, note func(string)) (provision.CanaryVerdict, func(), error) {
	c.mu.Lock()
	c.classes = append(c.classes, class+"|"+key)
	c.mu.Unlock()
	if c.v.Node != "" {
		note(c.v.Node)
	}
	if c.done != nil {
		return c.v, func() { close(c.done) }, c.err
	}
	return c.v, nil, c.err
}

// TestCanaryVerdictSkipsWhatFailedSimulated: under auto, a variant whose
// probe failed on the class's canary is not pulled here but recorded as
// an attempt of stage canary; one that passed is tried. A forced variant
// is the operator's call and asks no canary; a canary lead tries
// everything and hands its verdict on after; a canary that cannot be
// asked costs nothing but the saving.
func TestCanaryVerdictSkipsWhatFailedSimulated(t *testing.T) {
	set := memrt.EngineSet(demoRef, "demo", "1.0")
	cu13, cu129 := set.Variants[0], set.Variants[1]
	for _, tc := range []struct {
		name      string
		canary    *stubCanary
		override  string
		state     provision.State
		variant   string   // pinned
		pulled    []string // refs pulled, in order
		stages    []string // the attempts' stages
		asked     bool
		canaryFor string // the status's Canary
	}{
		{name: "cu13 failed on the canary", canary: &stubCanary{v: provision.CanaryVerdict{Node: "n1", Passed: cu129.Variant,
			Failed: map[string]string{cu13.Variant: "cuda error: no kernel image is available"}}},
			state: provision.Ready, variant: cu129.Variant, pulled: []string{cu129.Ref}, stages: []string{"canary"}, asked: true, canaryFor: "n1"},
		{name: "everything failed on the canary", canary: &stubCanary{v: provision.CanaryVerdict{Node: "n1",
			Failed: map[string]string{cu13.Variant: "timeout", cu129.Variant: "exit 3"}}},
			state: provision.Failed, stages: []string{"canary", "canary"}, asked: true, canaryFor: "n1"},
		{name: "this node is the canary", canary: &stubCanary{done: make(chan struct{})},
			state: provision.Ready, variant: cu13.Variant, pulled: []string{cu13.Ref}, asked: true},
		{name: "no verdict in time", canary: &stubCanary{v: provision.CanaryVerdict{Reason: "no verdict from canary n1 within 15m0s"}},
			state: provision.Ready, variant: cu13.Variant, pulled: []string{cu13.Ref}, asked: true},
		{name: "API error", canary: &stubCanary{err: errors.New("connection refused")},
			state: provision.Ready, variant: cu13.Variant, pulled: []string{cu13.Ref}, asked: true},
		{name: "a forced variant asks no canary", override: cu13.Variant, canary: &stubCanary{v: provision.CanaryVerdict{Node: "n1",
			Failed: map[string]string{cu13.Variant: "timeout"}}},
			state: provision.Ready, variant: cu13.Variant, pulled: []string{cu13.Ref}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memrt.New()
			m.SetProbe(cu13.Ref, memrt.Passing(), 0)
			m.SetProbe(cu129.Ref, memrt.Passing(), 0)
			var mu sync.Mutex
			var waiting []string
			p := memProvisioner(t, m, memrt.Resolver{demoRef: set}, h100("580.82.07", "13.0"), provision.WithCanary(tc.canary),
				provision.WithOnState(func(st provision.Status) {
					if st.Canary != "" && st.State == provision.Resolving {
						mu.Lock()
						waiting = append(waiting, st.Detail)
						mu.Unlock()
					}
				}))
			st := p.Provision(context.Background(), provision.Want{Ref: demoRef, Override: tc.override})
			if st.State != tc.state || st.Variant != tc.variant {
				t.Fatalf("state %s variant %q, want %s %q: %s", st.State, st.Variant, tc.state, tc.variant, st.Detail)
			}
			if got := m.Pulled(); !slices.Equal(got, tc.pulled) {
				t.Errorf("pulled %v, want %v", got, tc.pulled)
			}
			var stages []string
			for _, a := range st.Attempts {
				stages = append(stages, a.Stage)
				if a.Stage == "canary" && !strings.Contains(a.Reason, "failed on canary n1") {
					t.Errorf("attempt %s: reason %q does not name the canary", a.Variant, a.Reason)
				}
			}
			if !slices.Equal(stages, tc.stages) {
				t.Errorf("attempt stages %v, want %v", stages, tc.stages)
			}
			if asked := len(tc.canary.classes) > 0; asked != tc.asked {
				t.Fatalf("canary asked %v, want %v", tc.canary.classes, tc.asked)
			}
			if tc.asked && tc.canary.classes[0] != "NVIDIA H100 80GB HBM3 driver 580 simulated|demo:1.0" {
				t.Errorf("canary asked for %q", tc.canary.classes[0])
			}
			if st.Canary != tc.canaryFor {
				t.Errorf("status canary %q, want %q", st.Canary, tc.canaryFor)
			}
			if tc.canaryFor != "" && (len(waiting) == 0 || !strings.Contains(waiting[0], "waiting on canary n1")) {
				t.Errorf("waiting statuses %q", waiting)
			}
			if tc.canary.done != nil {
				select {
				case <-tc.canary.done:
				case <-time.After(5 * time.Second):
					t.Fatal("a canary's provision ended without handing its verdict on")
				}
			}
		})
	}
}
