package images

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/node"
)

func TestParseAnnotations(t *testing.T) {
	full := map[string]string{
		AnnotationEngine: "vllm", AnnotationEngineVersion: "0.11.0", AnnotationVariant: "cu13",
		AnnotationCUDA: "13.0", AnnotationDriverMin: "580.65.06", AnnotationArchs: "7.5,8.0,9.0,12.0+PTX",
		AnnotationProbe: "torch", "org.opencontainers.image.version": "0.11.0",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range full {
			m[a] = b
		}
		if v == "\x00delete" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name    string
		ann     map[string]string
		wantErr string
	}{
		{name: "full", ann: full},
		{name: "spaces trimmed", ann: with(AnnotationVariant, " cu13 ")},
		{name: "no driver min", ann: with(AnnotationDriverMin, "\x00delete")},
		{name: "no variant", ann: with(AnnotationVariant, "\x00delete"), wantErr: "io.gpupin.variant is missing"},
		{name: "bad variant", ann: with(AnnotationVariant, "CU13"), wantErr: "not a variant name"},
		{name: "variant with slash", ann: with(AnnotationVariant, "cu13/x"), wantErr: "not a variant name"},
		{name: "no cuda", ann: with(AnnotationCUDA, "\x00delete"), wantErr: "io.gpupin.cuda.version is missing"},
		{name: "bad cuda", ann: with(AnnotationCUDA, "13.x"), wantErr: "io.gpupin.cuda.version"},
		{name: "bad driver min", ann: with(AnnotationDriverMin, "latest"), wantErr: "io.gpupin.cuda.driver.min"},
		{name: "bad archs", ann: with(AnnotationArchs, "sm_90"), wantErr: "io.gpupin.cuda.archs"},
		{name: "bad probe", ann: with(AnnotationProbe, "bash"), wantErr: "want torch, cuda or exec"},
		{name: "bad engine", ann: with(AnnotationEngine, "vLLM!"), wantErr: "not an engine name"},
		{name: "control character", ann: with(AnnotationEngineVersion, "0.11\n0"), wantErr: "control character"},
		{name: "huge value", ann: with(AnnotationEngineVersion, strings.Repeat("9", maxAnnotation+1)), wantErr: "more than"},
		{name: "foreign annotations are not checked", ann: with("org.example.note", "line\nbreak")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseAnnotations(tc.ann)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Variant != "cu13" || m.CUDA != "13.0" || m.Engine != "vllm" {
				t.Errorf("metadata = %+v", m)
			}
			// Round trip: what Annotations renders parses back to the same.
			back, err := ParseAnnotations(m.Annotations())
			if err != nil || back != m {
				t.Errorf("round trip = %+v, %v; want %+v", back, err, m)
			}
		})
	}
}

func TestValidNames(t *testing.T) {
	for s, want := range map[string]bool{"cu13": true, "cu128-sm90": true, "cu12.9": true, "13": false, "Cu13": false, "cu--13": false, "": false} {
		if got := ValidVariantName(s); got != want {
			t.Errorf("ValidVariantName(%q) = %v, want %v", s, got, want)
		}
	}
	for s, want := range map[string]bool{"vllm": true, "vllm-openai": true, "llama.cpp": true, "0x": true, "VLLM": false, "-x": false, "a/b": false, "": false} {
		if got := ValidEngineName(s); got != want {
			t.Errorf("ValidEngineName(%q) = %v, want %v", s, got, want)
		}
	}
}

// Reject's checks that the registry tests do not reach.
func TestRejectUnit(t *testing.T) {
	f := &node.Facts{Driver: "575.57.08", CUDA: "12.9", Platform: "linux/amd64",
		GPUs: []node.GPU{{Index: 0, Name: "H100", CC: "9.0"}}}
	tests := []struct {
		name string
		v    Variant
		want string // substring; "" = accepted
	}{
		{"driver min not met", Variant{Metadata: Metadata{Variant: "cu129", CUDA: "12.9", DriverMin: "580.65.06"}}, "driver 575.57.08 is older than 580.65.06, the lowest this variant supports: upgrade the driver"},
		{"driver min met", Variant{Metadata: Metadata{Variant: "cu129", CUDA: "12.9", DriverMin: "570"}}, ""},
		{"no archs: no arch check", Variant{Metadata: Metadata{Variant: "cu129", CUDA: "12.9"}}, ""},
		{"older CUDA runs", Variant{Metadata: Metadata{Variant: "cu126", CUDA: "12.6", Archs: "9.0"}}, ""},
		{"derived with NVIDIA_DISABLE_REQUIRE skips the CUDA check", Variant{Metadata: Metadata{Variant: "cu13", CUDA: "13.0"}, Derived: true, RequireDisabled: true}, ""},
		{"annotated newer CUDA", Variant{Metadata: Metadata{Variant: "cu13", CUDA: "13.0"}}, "upgrade the driver or use a variant built for CUDA ≤ 12.9"},
	}
	for _, tc := range tests {
		got := Reject(f, tc.v)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: Reject = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestPlatformMatches(t *testing.T) {
	tests := []struct {
		entry, node string
		want        bool
	}{
		{"linux/amd64", "linux/amd64", true},
		{"", "linux/amd64", true},
		{"linux/arm64", "linux/amd64", false},
		{"linux/arm64/v8", "linux/arm64", true},
		{"windows/amd64", "linux/amd64", false},
		{"/", "linux/amd64", false},
	}
	for _, tc := range tests {
		if got := PlatformMatches(tc.entry, tc.node); got != tc.want {
			t.Errorf("PlatformMatches(%q, %q) = %v, want %v", tc.entry, tc.node, got, tc.want)
		}
	}
}
