package provision_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// Pins judges each pin against the node as it is now; RunPinned runs only
// a pin, and says first whether it is stale or simulated.
func TestPinsAndRunPinnedSimulated(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	if st := e.p.Provision(ctx, provision.Want{Ref: e.ref}); st.State != provision.Ready {
		t.Fatalf("%s", st)
	}
	valid := func() []bool {
		t.Helper()
		pins, err := e.p.Pins(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		var out []bool
		for _, p := range pins {
			if p.Key != "demo:1.0" || p.Valid == nil || len(p.SimulatedChecks) == 0 || p.VerdictError != "" {
				t.Fatalf("pin %+v; want demo:1.0 judged, with its simulated checks", p)
			}
			out = append(out, *p.Valid)
		}
		return out
	}
	if got := valid(); len(got) != 1 || !got[0] {
		t.Fatalf("valid = %v before the upgrade, want [true]", got)
	}
	e.node.Set(h100("580.82.07", "13.0"))
	if got := valid(); len(got) != 1 || got[0] {
		t.Fatalf("valid = %v after the upgrade, want [false]", got)
	}

	var out strings.Builder
	var told []provision.Replica
	res, err := e.p.RunPinned(ctx, "demo:1.0", containerd.RunSpec{Args: []string{"/bin/sh", "-c", "echo replica; exit 3"}, Stdout: &out},
		func(r provision.Replica) { told = append(told, r) })
	if err != nil || res.ExitCode != 3 || out.String() != "replica\n" {
		t.Fatalf("run: exit %d, %v, output %q", res.ExitCode, err, out.String())
	}
	if len(told) != 1 || !told[0].Stale || !told[0].Simulated || told[0].Pin.Key != "demo:1.0" {
		t.Fatalf("told %+v; want one stale, simulated replica of demo:1.0", told)
	}
	if _, err := e.p.RunPinned(ctx, "demo:2.0", containerd.RunSpec{Args: []string{"true"}}, nil); !errors.Is(err, containerd.ErrNoPin) {
		t.Fatalf("run of a key without a pin: %v; want ErrNoPin", err)
	}
}

// `gpupin pins` only reads: a pin another client of containerd deleted is
// not put back by the listing (a provision, the agent's pass or the
// runtime's repairing Pins does that).
func TestPinsListingWritesNothingSimulated(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{cu13})
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if st.State != provision.Ready {
		t.Fatalf("%s", st)
	}
	images := e.rt.Client().ImageService()
	if err := images.Delete(testenv.Context(e.rt), st.Pinned); err != nil {
		t.Fatal(err)
	}
	pins, err := e.p.Pins(ctx, false)
	if err != nil || len(pins) != 0 {
		t.Fatalf("listing after another client deleted the pin: %+v, %v; want none", pins, err)
	}
	if _, err := images.Get(testenv.Context(e.rt), st.Pinned); !errdefs.IsNotFound(err) {
		t.Fatalf("the listing put the record back (get: %v)", err)
	}
	// The repairing reading does put it back: the difference is the point.
	if restored, err := e.rt.Pins(ctx); err != nil || len(restored) != 1 || restored[0].Ref != st.Pinned {
		t.Fatalf("runtime Pins: %+v, %v; want %s restored", restored, err, st.Pinned)
	}
}
