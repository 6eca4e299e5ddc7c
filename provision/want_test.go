package provision_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/provision"
)

// ValidateWant refuses, before anything is fetched, engine and version
// values a pin could not carry or a person could be fooled by, references
// that do not parse (bad digests among them) and malformed overrides.
func TestValidateWant(t *testing.T) {
	const ref = "reg.example/vllm:0.11.0"
	long := strings.Repeat("a", 4096)
	for _, tc := range []struct {
		name    string
		want    provision.Want
		wantErr string // "" = valid
	}{
		{"plain", provision.Want{Engine: "vllm", Version: "0.11.0", Ref: ref}, ""},
		{"version with build", provision.Want{Engine: "vllm", Version: "0.11.0+cu129-rc_1", Ref: ref}, ""},
		{"by metadata", provision.Want{Ref: ref}, ""},
		{"by digest", provision.Want{Ref: "reg.example/vllm@sha256:" + strings.Repeat("ab", 32)}, ""},
		{"engine with a control character", provision.Want{Engine: "vl\x01lm", Version: "1", Ref: ref}, "not an engine name"},
		{"engine with ESC", provision.Want{Engine: "\x1b[31mvllm", Version: "1", Ref: ref}, "not an engine name"},
		{"engine with newline", provision.Want{Engine: "vllm\n", Version: "1", Ref: ref}, "not an engine name"},
		{"engine with U+202E", provision.Want{Engine: "vllm\u202e", Version: "1", Ref: ref}, "not an engine name"},
		{"engine with U+200F", provision.Want{Engine: "\u200fvllm", Version: "1", Ref: ref}, "not an engine name"},
		{"engine $(id)", provision.Want{Engine: "$(id)", Version: "1", Ref: ref}, "not an engine name"},
		{"engine upper case", provision.Want{Engine: "VLLM", Version: "1", Ref: ref}, "not an engine name"},
		{"engine of 4 KiB", provision.Want{Engine: long, Version: "1", Ref: ref}, "not an engine name"},
		{"version with a control character", provision.Want{Engine: "vllm", Version: "0.11\x7f", Ref: ref}, "not an engine version"},
		{"version with ESC", provision.Want{Engine: "vllm", Version: "0.11\x1b]0;x\x07", Ref: ref}, "not an engine version"},
		{"version with U+202E", provision.Want{Engine: "vllm", Version: "0.11.0\u202e1", Ref: ref}, "not an engine version"},
		{"version with U+200F", provision.Want{Engine: "vllm", Version: "\u200f0.11.0", Ref: ref}, "not an engine version"},
		{"version $(id)", provision.Want{Engine: "vllm", Version: "$(id)", Ref: ref}, "not an engine version"},
		{"version with a space", provision.Want{Engine: "vllm", Version: "0.11 0", Ref: ref}, "not an engine version"},
		{"version of 4 KiB", provision.Want{Engine: "vllm", Version: long, Ref: ref}, "not an engine version"},
		{"empty ref", provision.Want{Engine: "vllm", Version: "1"}, "ref is empty"},
		{"ref with a control character", provision.Want{Ref: "reg.example/vl\x1blm:1"}, "ref"},
		{"ref with U+202E", provision.Want{Ref: "reg.example/vllm:1\u202e"}, "ref"},
		{"ref $(id)", provision.Want{Ref: "reg.example/$(id):1"}, "ref"},
		{"ref of 4 KiB", provision.Want{Ref: "reg.example/" + long + ":1"}, "ref"},
		{"digest too short", provision.Want{Ref: "reg.example/vllm@sha256:abc"}, "ref"},
		{"digest not hex", provision.Want{Ref: "reg.example/vllm@sha256:" + strings.Repeat("zz", 32)}, "ref"},
		{"digest of an unknown algorithm", provision.Want{Ref: "reg.example/vllm@md5:" + strings.Repeat("ab", 16)}, "ref"},
		{"digest empty", provision.Want{Ref: "reg.example/vllm@sha256:"}, "ref"},
		{"override with ESC", provision.Want{Ref: ref, Override: "cu13\x1b"}, "override"},
		{"override with U+202E", provision.Want{Ref: ref, Override: "cu\u202e13"}, "override"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := provision.ValidateWant(tc.want)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateWant: %v", err)
				}
				return
			}
			if !errors.Is(err, provision.ErrInvalidWant) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ValidateWant = %v; want ErrInvalidWant with %q", err, tc.wantErr)
			}
			// The message quotes the value: no raw control or bidi
			// character reaches a terminal or a log through it.
			for _, r := range err.Error() {
				if r < 0x20 || r == 0x7f || r == '\u202e' || r == '\u200f' {
					t.Fatalf("the error carries %U raw: %q", r, err.Error())
				}
			}
		})
	}
}
