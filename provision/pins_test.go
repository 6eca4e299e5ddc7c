package provision_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
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
