package pins_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestLocalName(t *testing.T) {
	tests := []struct {
		prefix, key, want string
		hashed            bool // a hash of the key is appended
		err               bool
	}{
		{"", "vllm:0.11.0", "gpupin.local/vllm:0.11.0", false, false},
		{"gpupin.local", "sglang:0.5.0rc1", "gpupin.local/sglang:0.5.0rc1", false, false},
		{"registry.internal:5000/node", "llama.cpp:b4500", "registry.internal:5000/node/llama.cpp:b4500", false, false},
		{"localhost", "trt-llm:1.0", "localhost/trt-llm:1.0", false, false},
		// '+' (semantic versions' build metadata) is no tag character.
		{"", "vllm:0.11.0+cu129", "gpupin.local/vllm:0.11.0_cu129-", true, false},
		// A key named by a digest.
		{"", "eng:sha256:0123456789a", "gpupin.local/eng:sha256_0123456789a-", true, false},
		// Separators a repository component may not end with.
		{"", "eng-:1", "gpupin.local/eng-", true, false},
		{"", "a..b:1", "gpupin.local/a-b-", true, false},
		{"", "novel", "", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			got, err := containerd.LocalName(tc.prefix, tc.key)
			if tc.err {
				if err == nil {
					t.Fatalf("LocalName(%q) = %q, want an error", tc.key, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.hashed && !strings.HasPrefix(got, tc.want) || !tc.hashed && got != tc.want {
				t.Fatalf("LocalName(%q, %q) = %q, want %q", tc.prefix, tc.key, got, tc.want)
			}
			if again, _ := containerd.LocalName(tc.prefix, tc.key); again != got {
				t.Fatalf("not stable: %q then %q", got, again)
			}
		})
	}
	// Keys the mapping changes never meet keys it keeps.
	a, _ := containerd.LocalName("", "vllm:1.0+a")
	b, _ := containerd.LocalName("", "vllm:1.0_a")
	if a == b {
		t.Fatalf("two keys share %s", a)
	}
}

func TestLocalPrefixIsChecked(t *testing.T) {
	d := testenv.Containerd(t)
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"gpupin.local", true},
		{"registry.internal/gpupin/node", true},
		{"vllm", false}, // would normalise to docker.io/library/…
		{"bad host", false},
	} {
		rt, err := containerd.Connect(context.Background(), d.Address, containerd.WithLocalPrefix(tc.prefix))
		if (err == nil) != tc.ok {
			t.Errorf("prefix %q: err = %v, want ok=%v", tc.prefix, err, tc.ok)
		}
		if rt != nil {
			rt.Close()
		}
	}
}

// A prefix of the runtime's own: the name is made under it; a name that
// another prefix made moves along.
func TestLocalPrefixOption(t *testing.T) {
	w := newPinWorld(t, containerd.WithLocalPrefix("node.example/gpupin"))
	w.pin(0)
	if p := w.current(); p == nil || p.Local != "node.example/gpupin/eng:1" {
		t.Fatalf("pin %+v, want local name node.example/gpupin/eng:1", p)
	}
	other, err := containerd.Connect(context.Background(), testenv.Containerd(t).Address,
		containerd.WithNamespace(w.rt.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.SetPin(context.Background(), containerd.Pin{Key: "eng:1", Ref: w.refs[1], Source: w.source, Node: "sha256-node", ProbedAt: time.Now()}, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node.example/gpupin/eng:1", "gpupin.local/eng:1"} {
		rec, ok := w.record(name)
		if !ok || rec.Target.Digest.String() != digestPart(w.refs[1]) {
			t.Errorf("%s: present %v, on %s; want it on the new pin", name, ok, rec.Target.Digest)
		}
	}
}
