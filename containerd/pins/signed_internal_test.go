package pins

import (
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// The signature travels in labels; a pin made before them reads with
// Signed nil, and one made with them reads back what was written.
func TestSignedLabels(t *testing.T) {
	at := time.Date(2026, 12, 7, 6, 0, 0, 123, time.UTC)
	cases := []struct {
		name   string
		signed *Signature
	}{
		{"unsigned (an older pin, or mode off)", nil},
		{"signed by a key", &Signature{Mode: "required", By: "key ci.pub (sha256:0123456789abcdef)", Digest: "sha256:ab", At: at}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Pin{Key: "vllm:0.11.0", Variant: "cu13", Signed: tc.signed}
			img := images.Image{Name: "r/vllm@sha256:ab", Labels: p.labels(), Target: ocispec.Descriptor{Digest: "sha256:ab"}}
			got := pinFromImage(img).Signed
			if (got == nil) != (tc.signed == nil) || (got != nil && (*got != *tc.signed)) {
				t.Fatalf("Signed = %+v, want %+v", got, tc.signed)
			}
			if tc.signed == nil {
				for _, k := range []string{LabelSignedMode, LabelSignedBy, LabelSignedDigest, LabelSignedAt} {
					if _, ok := img.Labels[k]; ok {
						t.Errorf("unsigned pin has label %s", k)
					}
				}
			}
		})
	}
}
