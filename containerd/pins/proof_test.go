package pins

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd/conn"
)

// pinRecord is a pin record of key on the image whose manifest is the
// digest of seed, as SetPin leaves one.
func pinRecord(key, seed string, at time.Time) images.Image {
	d := digest.FromString(seed)
	return images.Image{
		Name:   "reg.test/eng@" + d.String(),
		Target: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d, Size: 1234},
		Labels: map[string]string{
			LabelPin: key, LabelVariant: "cu129", conn.LabelSource: "reg.test/eng:1", LabelNode: "sha256-node",
			LabelProbedAt: at.Format(time.RFC3339Nano), LabelProbe: "cuda", LabelVerdict: `{"ok":true}`, LabelOverride: "auto",
			LabelCRIPinned: "pinned", conn.LabelManaged: "true", conn.LabelCreated: "true",
			conn.LabelOwner: "pid:1:2", conn.LabelRole: "candidate",
		},
		UpdatedAt: at,
	}
}

func TestProofOfKeepsHowItWasProved(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 5, time.FixedZone("x", 3600))
	img := pinRecord("eng:1", "a", at)
	p := proofOf(img)
	if p.Ref != img.Name || p.Digest != img.Target.Digest.String() || p.MediaType != img.Target.MediaType || p.Size != 1234 {
		t.Errorf("proofOf = %+v; want the record's name and target", p)
	}
	if !p.PinnedAt.Equal(at) || p.PinnedAt.Location() != time.UTC {
		t.Errorf("PinnedAt = %v; want %v in UTC", p.PinnedAt, at)
	}
	for _, k := range []string{conn.LabelOwner, conn.LabelRole} {
		if _, ok := p.Labels[k]; ok {
			t.Errorf("proof keeps %s: who worked on a pin is not how it was proved", k)
		}
	}
	for _, k := range proofLabelKeys {
		if p.Labels[k] != img.Labels[k] {
			t.Errorf("proof label %s = %q; want %q", k, p.Labels[k], img.Labels[k])
		}
	}
	if got := p.target(); got.Digest != img.Target.Digest || got.MediaType != img.Target.MediaType || got.Size != img.Target.Size {
		t.Errorf("target = %+v; want %+v", got, img.Target)
	}
}

func TestProofEncoding(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		key     string
		edit    func(*images.Image)
		err     string // the encoding fails so
		cut     bool   // the verdict is shortened to fit
		matches bool   // the decoded proof still matches the record
	}{
		{name: "a pin as SetPin writes it", key: "eng:1", matches: true},
		{name: "a key of many characters", key: strings.Repeat("e", 200) + ":" + strings.Repeat("1", 100), matches: true},
		{name: "a verdict too long for a label is shortened", key: "eng:1", cut: true, matches: true,
			edit: func(img *images.Image) {
				img.Labels[LabelVerdict] = `{"ok":true,"detail":"` + strings.Repeat("x", 6000) + `"}`
			}},
		{name: "a verdict JSON escapes is shortened", key: "eng:1", cut: true, matches: true,
			edit: func(img *images.Image) {
				img.Labels[LabelVerdict] = strings.Repeat("x", 3000) + strings.Repeat(`"`, 1000)
			}},
		{name: "a proof too long without its verdict does not fit", key: "eng:1", err: "does not fit a label",
			edit: func(img *images.Image) { img.Labels[conn.LabelSource] = "reg.test/" + strings.Repeat("s", maxLabel) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img := pinRecord(tc.key, "a", at)
			if tc.edit != nil {
				tc.edit(&img)
			}
			before := cloneLabels(img.Labels)
			p := proofOf(img)
			v, err := p.encode(tc.key)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("encode = %d bytes, %v; want an error saying %q", len(v), err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n := len(proofLabel(tc.key)) + len(v); n > maxLabel {
				t.Errorf("label and value are %d bytes; containerd takes %d", n, maxLabel)
			}
			if p.Labels[LabelVerdict] != img.Labels[LabelVerdict] || img.Labels[LabelVerdict] != before[LabelVerdict] {
				t.Error("encode changed the proof or the record it was made from")
			}
			sp := decodeProof(img.Target.Digest, v)
			if !sp.valid {
				t.Fatalf("decodeProof(encode) is not valid: %q", v)
			}
			if got := sp.Labels[LabelVerdict]; tc.cut != (got != img.Labels[LabelVerdict]) || (tc.cut && !strings.HasSuffix(got, "...")) {
				t.Errorf("verdict read back %d bytes (%.20q…); cut %v", len(got), got, tc.cut)
			}
			if sp.matches(img) != tc.matches {
				t.Errorf("matches = %v; want %v", !tc.matches, tc.matches)
			}
		})
	}
}

func TestDecodeProof(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	img := pinRecord("eng:1", "a", at)
	good, err := proofOf(img).encode("eng:1")
	if err != nil {
		t.Fatal(err)
	}
	other := digest.FromString("b")
	noRef, _ := json.Marshal(proof{Digest: img.Target.Digest.String()})
	cases := []struct {
		name  string
		on    digest.Digest
		v     string
		valid bool
	}{
		{"the proof of the content it is on", img.Target.Digest, good, true},
		{"no label (taken off, or the content gone)", img.Target.Digest, "", false},
		{"a label that does not parse", img.Target.Digest, "{not json", false},
		{"a proof that names no record", img.Target.Digest, string(noRef), false},
		{"a proof of other content (copied)", other, good, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sp := decodeProof(tc.on, tc.v)
			if sp.valid != tc.valid || sp.on != tc.on {
				t.Errorf("decodeProof = on %s valid %v; want on %s valid %v", sp.on, sp.valid, tc.on, tc.valid)
			}
		})
	}
}

func TestProofMatches(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		edit func(*images.Image)
		want bool
	}{
		{"the record it was made from", func(*images.Image) {}, true},
		{"another verdict (the proof may keep it shortened)", func(img *images.Image) { img.Labels[LabelVerdict] = `{"ok":true,"x":1}` }, true},
		{"another owner (not how it was proved)", func(img *images.Image) { img.Labels[conn.LabelOwner] = "pid:9:9" }, true},
		{"updated since (confirmed again, or pulled over)", func(img *images.Image) { img.UpdatedAt = at.Add(time.Second) }, false},
		{"another variant", func(img *images.Image) { img.Labels[LabelVariant] = "cu13" }, false},
		// Only the labels the record has are compared: a pull that takes
		// labels off also moves UpdatedAt.
		{"a label gone from the record, nothing else changed", func(img *images.Image) { delete(img.Labels, LabelOverride) }, true},
		{"a label the proof has not", func(img *images.Image) { img.Labels[LabelSimulated] = "true" }, false},
		{"another record of the name", func(img *images.Image) { img.Target.Size++ }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img := pinRecord("eng:1", "a", at)
			p := proofOf(img)
			tc.edit(&img)
			if got := p.matches(img); got != tc.want {
				t.Errorf("matches = %v; want %v", got, tc.want)
			}
		})
	}
}

func TestRestoredLabels(t *testing.T) {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	p := proofOf(pinRecord("eng:1", "a", at))
	delete(p.Labels, LabelCRIPinned)
	now := time.Date(2026, 12, 7, 10, 30, 0, 0, time.FixedZone("x", 3600))
	got := p.restoredLabels(now)
	if got[LabelRestored] != "2026-12-07T09:30:00Z" || got[LabelCRIPinned] != "pinned" || got[conn.LabelManaged] != "true" || got[LabelPin] != "eng:1" {
		t.Errorf("restoredLabels = %v", got)
	}
	if _, ok := p.Labels[LabelRestored]; ok {
		t.Error("restoredLabels changed the proof")
	}
}
