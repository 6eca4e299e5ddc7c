package provision_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// stubGate records the references it is asked about, notes a line, and
// either runs the pull or returns without it (as Gate.Fetch does when
// its context ends).
type stubGate struct {
	mu     sync.Mutex
	asked  []string
	pulled int
	skip   error // returned without pulling, when set
}

func (g *stubGate) Fetch(ctx context.Context, ref string, note func(string), pull func(context.Context, func(int64, int64)) error) error {
	g.mu.Lock()
	g.asked = append(g.asked, ref)
	g.mu.Unlock()
	note("waiting for n7 to fetch")
	if g.skip != nil {
		return g.skip
	}
	g.mu.Lock()
	g.pulled++
	g.mu.Unlock()
	return pull(ctx, func(int64, int64) {})
}

// TestFetchGateOrdersEveryPull: every candidate's pull goes through the
// gate, by its digested reference; the gate's note is the Pulling
// status's detail; a gate that returns without pulling fails that
// candidate's pull (never a pull behind its back), and nothing is pinned.
func TestFetchGateOrdersEveryPull(t *testing.T) {
	set := memrt.EngineSet(demoRef, "demo", "1.0")
	for _, tc := range []struct {
		name      string
		skip      error
		wantState provision.State
		wantPulls int
		wantAsked int // candidates the gate was asked about
	}{
		{name: "pulls through the gate", wantState: provision.Ready, wantPulls: 1, wantAsked: 1},
		// Each candidate's pull fails in turn; none is pulled around the gate.
		{name: "gate ends without a pull", skip: context.Canceled, wantState: provision.Failed, wantPulls: 0, wantAsked: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memrt.New()
			m.SetProbe(set.Variants[0].Ref, memrt.Passing(), 0)
			m.SetProbe(set.Variants[1].Ref, memrt.Passing(), 0)
			g := &stubGate{skip: tc.skip}
			var details []string
			var mu sync.Mutex
			p := memProvisioner(t, m, memrt.Resolver{demoRef: set}, h100("580.82.07", "13.0"), provision.WithFetchGate(g),
				provision.WithOnState(func(st provision.Status) {
					if st.State == provision.Pulling {
						mu.Lock()
						details = append(details, st.Detail)
						mu.Unlock()
					}
				}))
			st := p.Provision(context.Background(), provision.Want{Ref: demoRef})
			if st.State != tc.wantState {
				t.Fatalf("state %s, want %s: %s", st.State, tc.wantState, st.Detail)
			}
			if len(g.asked) == 0 || g.asked[0] != set.Variants[0].Ref {
				t.Errorf("gate asked %v, want %s first", g.asked, set.Variants[0].Ref)
			}
			if got := len(m.Pulled()); got != tc.wantPulls || g.pulled != tc.wantPulls {
				t.Errorf("runtime pulls %d, gate pulls %d, want %d", got, g.pulled, tc.wantPulls)
			}
			if len(g.asked) != tc.wantAsked {
				t.Errorf("gate asked %d times (%v), want %d", len(g.asked), g.asked, tc.wantAsked)
			}
			noted := false
			for _, d := range details {
				noted = noted || strings.HasSuffix(d, ": waiting for n7 to fetch") && strings.HasPrefix(d, "pulling ")
			}
			if !noted {
				t.Errorf("the gate's note is in no Pulling detail: %q", details)
			}
			pins, _ := m.ListPins(context.Background())
			if tc.skip != nil && len(pins) != 0 {
				t.Errorf("pinned %v without a pull", pins)
			}
		})
	}
	if _, err := provision.New(memrt.New(), provision.WithFetchGate(nil)); err == nil {
		t.Error("WithFetchGate(nil) accepted")
	}
}

// TestImageStoredSeesCommittedLayers: against a real containerd, the fetch
// gate's store check (fetchgate.WithStored) says no before the pull, yes
// once every layer blob is committed, and no again when one of them goes.
func TestImageStoredSeesCommittedLayers(t *testing.T) {
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t, containerd.WithKeepLayers(true))
	ctx := testenv.Context(rt)
	layer, err := sandbox.RandomLayer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	img, err := sandbox.Image(sandbox.ImageSpec{Layers: []v1.Layer{layer}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := sandbox.PushImage(ctx, reg.Host+"/stored:1", img)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/stored@" + h.String()
	ld, err := layer.Digest()
	if err != nil {
		t.Fatal(err)
	}
	stored := provision.ImageStored(rt)
	for _, step := range []struct {
		name string
		do   func() error
		want bool
	}{
		{"before the pull", func() error { return nil }, false},
		{"pulled", func() error { _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); return err }, true},
		{"a layer blob gone", func() error { return rt.Client().ContentStore().Delete(ctx, digest.Digest(ld.String())) }, false},
		{"no digest", func() error { ref = reg.Host + "/stored:1"; return nil }, false},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := stored(ctx, ref); got != step.want {
			t.Errorf("%s: ImageStored = %v, want %v", step.name, got, step.want)
		}
	}
}
