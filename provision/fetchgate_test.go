package provision_test

import (
	"context"
	"slices"
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

func (g *stubGate) Fetch(ctx context.Context, ref string, note func(string), pull provision.GatedPull) error {
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
	return pull(ctx, func(int64, int64) {}, nil)
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
// gate's store check (fetchgate.WithStored) lists no layer before the pull,
// every layer in the manifest's order once each blob is committed, and,
// when one goes, the rest and not all.
func TestImageStoredSeesCommittedLayers(t *testing.T) {
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t, containerd.WithKeepLayers(true))
	ctx := testenv.Context(rt)
	var layers []v1.Layer
	var digests []string
	for range 2 {
		layer, err := sandbox.RandomLayer(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		ld, err := layer.Digest()
		if err != nil {
			t.Fatal(err)
		}
		layers, digests = append(layers, layer), append(digests, ld.String())
	}
	img, err := sandbox.Image(sandbox.ImageSpec{Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	h, err := sandbox.PushImage(ctx, reg.Host+"/stored:1", img)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/stored@" + h.String()
	// The image's layers as its manifest orders them (sandbox.Image puts
	// its own base first); the second step deletes the first of ours.
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var all, rest []string
	for _, l := range m.Layers {
		all = append(all, l.Digest.String())
		if l.Digest.String() != digests[0] {
			rest = append(rest, l.Digest.String())
		}
	}
	stored := provision.ImageStored(rt)
	for _, step := range []struct {
		name    string
		do      func() error
		want    []string
		wantAll bool
	}{
		{"before the pull", func() error { return nil }, nil, false},
		{"pulled", func() error { _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); return err }, all, true},
		{"a layer blob gone", func() error { return rt.Client().ContentStore().Delete(ctx, digest.Digest(digests[0])) }, rest, false},
		{"no digest", func() error { ref = reg.Host + "/stored:1"; return nil }, nil, false},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got, all := stored(ctx, ref); !slices.Equal(got, step.want) || all != step.wantAll {
			t.Errorf("%s: ImageStored = %v, %v; want %v, %v", step.name, got, all, step.want, step.wantAll)
		}
	}
}
