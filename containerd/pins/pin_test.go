package pins_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/testenv"
)

// FindPin is the lookup `gpupin run` uses: a tampered record is refused by
// key, reference and source alike, and never passed over for another
// record.
func TestFindPin(t *testing.T) {
	good := containerd.Pin{Key: "demo:1.0", Ref: "reg/demo@sha256:aa", Digest: "sha256:aa", Source: "reg/demo:1.0"}
	bad := containerd.Pin{Key: "demo:1.0", Ref: "reg/demo@sha256:bb", Digest: "sha256:cc", Source: "reg/demo:1.0", Tampered: true}
	lone := containerd.Pin{Key: "solo:2", Ref: "reg/solo@sha256:dd", Digest: "sha256:ee", Source: "reg/solo:2", Tampered: true}
	other := containerd.Pin{Key: "other:1", Ref: "reg/other@sha256:ff", Digest: "sha256:ff", Source: "reg/other:1"}
	pins := []containerd.Pin{good, bad, lone, other}
	for _, tc := range []struct {
		name    string
		target  string
		want    string // the pin's Ref
		wantErr error
	}{
		{"key with a pin beside a tampered record", "demo:1.0", good.Ref, nil},
		{"the tampered record by reference", bad.Ref, "", containerd.ErrTampered},
		{"the good record by reference", good.Ref, good.Ref, nil},
		{"key held only by a tampered record", "solo:2", "", containerd.ErrTampered},
		{"reference of a lone tampered record", lone.Ref, "", containerd.ErrTampered},
		{"source of a lone tampered record", lone.Source, "", containerd.ErrTampered},
		{"source", other.Source, other.Ref, nil},
		{"unknown", "nope:1", "", containerd.ErrNoPin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerd.FindPin(pins, tc.target)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != nil {
					t.Fatalf("FindPin(%s) = %+v, %v; want %v", tc.target, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got == nil || got.Ref != tc.want || got.Tampered {
				t.Fatalf("FindPin(%s) = %+v, %v; want %s", tc.target, got, err, tc.want)
			}
		})
	}
}

// Pins made before io.gpupin.verdict existed kept the verdict under
// io.gpupin.probe. A record labelled so by an older gpupin still reads as
// a pin with its verdict (and no probe kind), while io.gpupin.probe keeps
// naming the probe kind on records that have the verdict's own key.
func TestPinReadsTheVerdictUnderItsOldKey(t *testing.T) {
	const verdict = `{"ok":true,"devices":[{"i":0,"cc":"9.0","tflops":1.5}],"simulated":true,"simulated_checks":["the matmul"]}`
	for _, tc := range []struct {
		name        string
		labels      map[string]string // io.gpupin.probe and io.gpupin.verdict as written
		wantProbe   string
		wantVerdict string
	}{
		{"verdict under the probe key", map[string]string{containerd.LabelProbe: verdict}, "", verdict},
		{"each under its own key", map[string]string{containerd.LabelProbe: "cuda", containerd.LabelVerdict: verdict}, "cuda", verdict},
		{"a probe kind alone", map[string]string{containerd.LabelProbe: "torch"}, "torch", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			ref := ctrtest.Pushed(t, reg, "MIGRATE=1")
			if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			pin := containerd.Pin{Key: "old:1", Ref: ref, Variant: "cu129", Source: reg.Host + "/eng:1", Override: "auto", Node: "sha256-x",
				ProbedAt: time.Now(), Probe: "sim", Verdict: `{"ok":true}`, Simulated: true}
			if err := rt.SetPin(ctx, pin, containerd.SetPinOptions{}); err != nil {
				t.Fatal(err)
			}
			// The two labels as the older gpupin left them.
			nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
			is := rt.Client().ImageService()
			img, err := is.Get(nsctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			delete(img.Labels, containerd.LabelProbe)
			delete(img.Labels, containerd.LabelVerdict)
			for k, v := range tc.labels {
				img.Labels[k] = v
			}
			if _, err := is.Update(nsctx, img, "labels."+containerd.LabelProbe, "labels."+containerd.LabelVerdict); err != nil {
				t.Fatal(err)
			}

			got, err := rt.GetPin(ctx, "old:1")
			if err != nil || got == nil {
				t.Fatalf("GetPin = %+v, %v", got, err)
			}
			pins, err := rt.Pins(ctx)
			if err != nil || len(pins) != 1 {
				t.Fatalf("Pins = %+v, %v; want the one pin", pins, err)
			}
			for _, p := range []containerd.Pin{*got, pins[0]} {
				if p.Key != "old:1" || p.Ref != ref || p.Probe != tc.wantProbe || p.Verdict != tc.wantVerdict {
					t.Errorf("pin %s at %s: probe %q, verdict %q; want probe %q, verdict %q", p.Key, p.Ref, p.Probe, p.Verdict, tc.wantProbe, tc.wantVerdict)
				}
			}
		})
	}
}

// A demoted pin, by a newer pin of its key or by unpin, keeps every label
// that says how it was proved, io.gpupin.simulated and io.gpupin.override
// among them, so a rollback knows what it returns to; it loses the key and
// kubelet's pinned mark.
func TestDemotedPinKeepsHowItWasProved(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	var refs []string
	for _, env := range []string{"DEMOTE=a", "DEMOTE=b"} {
		ref := ctrtest.Pushed(t, reg, env)
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
