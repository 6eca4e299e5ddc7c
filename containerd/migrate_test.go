package containerd_test

import (
	"context"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

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
			ref := pushed(t, reg, "MIGRATE=1")
			if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			pin := containerd.Pin{Key: "old:1", Ref: ref, Variant: "cu129", Source: reg.Host + "/eng:1", Override: "auto", Node: "sha256-x",
				ProbedAt: time.Now(), Probe: "sim", Verdict: `{"ok":true}`, Simulated: true}
			if err := rt.SetPin(ctx, pin, containerd.SetPinOptions{}); err != nil {
				t.Fatal(err)
			}
			// The two labels as the older gpupin left them.
			nsctx := withNS(ctx, rt.Namespace())
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
