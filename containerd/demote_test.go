package containerd_test

import (
	"context"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

// A demoted pin, by a newer pin of its key or by unpin, keeps every label
// that says how it was proved, io.gpupin.simulated and io.gpupin.override
// among them, so a rollback knows what it returns to; it loses the key and
// kubelet's pinned mark.
func TestDemotedPinKeepsHowItWasProved(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	nsctx := withNS(ctx, rt.Namespace())
	var refs []string
	for _, env := range []string{"DEMOTE=a", "DEMOTE=b"} {
		ref := pushed(t, reg, env)
		if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	pinOf := func(ref, override string, simulated bool) containerd.Pin {
		return containerd.Pin{Key: "demo:1", Ref: ref, Variant: "cu129", Source: "reg/demo:1", Override: override, Node: "fp",
			ProbedAt: time.Now(), Probe: "cuda", Verdict: `{"ok":true}`, Simulated: simulated}
	}
	for _, tc := range []struct {
		name   string
		pin    containerd.Pin
		demote func(t *testing.T)
	}{
		{"by a newer pin", pinOf(refs[0], "cu129", true), func(t *testing.T) {
			if err := rt.SetPin(ctx, pinOf(refs[1], "auto", false), containerd.SetPinOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"by unpin", pinOf(refs[1], "reg/other:2", true), func(t *testing.T) {
			if _, err := rt.Unpin(ctx, "demo:1"); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := rt.SetPin(ctx, tc.pin, containerd.SetPinOptions{}); err != nil {
				t.Fatal(err)
			}
			tc.demote(t)
			img, err := rt.Client().ImageService().Get(nsctx, tc.pin.Ref)
			if err != nil {
				t.Fatal(err)
			}
			l := img.Labels
			for k, want := range map[string]string{
				containerd.LabelPrevious: "demo:1", containerd.LabelSimulated: "true", containerd.LabelOverride: tc.pin.Override,
				containerd.LabelVariant: "cu129", containerd.LabelSource: "reg/demo:1", containerd.LabelNode: "fp",
				containerd.LabelProbe: "cuda", containerd.LabelVerdict: `{"ok":true}`,
			} {
				if l[k] != want {
					t.Errorf("label %s = %q, want %q", k, l[k], want)
				}
			}
			for _, k := range []string{containerd.LabelPin, containerd.LabelCRIPinned} {
				if v, ok := l[k]; ok {
					t.Errorf("label %s = %q kept on a demoted pin", k, v)
				}
			}
			prev, err := rt.PreviousPins(ctx)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, p := range prev {
				if p.Ref == tc.pin.Ref {
					found = true
					if !p.Simulated || p.Override != tc.pin.Override || !p.Previous {
						t.Errorf("previous pin %+v; want simulated, override %s", p, tc.pin.Override)
					}
				}
			}
			if !found {
				t.Errorf("%s is not among the previous pins: %+v", tc.pin.Ref, prev)
			}
		})
	}
}
