package fleet

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ov(name, engine, choice, nodeName string, sel map[string]string) EngineOverride {
	o := EngineOverride{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: EngineOverrideSpec{Engine: engine, Choice: choice, NodeName: nodeName}}
	if sel != nil {
		o.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: sel}
	}
	return o
}

// The precedence alone, without an API server: node > group > cluster,
// ties by name, a bad choice kept as the winner with its error.
func TestResolvePrecedence(t *testing.T) {
	a10 := map[string]string{"nvidia.com/gpu.product": "NVIDIA-A10"}
	cases := []struct {
		name     string
		ovs      []EngineOverride
		node     string
		labels   map[string]string
		want     string // choice for vllm; "" = absent
		from     string
		shadowed int
		bad      bool
	}{
		{"nothing", nil, "n1", a10, "", "", 0, false},
		{"cluster", []EngineOverride{ov("all", "vllm", "cu13", "", nil)}, "n1", a10, "cu13", "all", 0, false},
		{"group beats cluster", []EngineOverride{ov("all", "vllm", "cu13", "", nil), ov("a10", "vllm", "cu129", "", a10)}, "n1", a10, "cu129", "a10", 0, false},
		{"group not matching", []EngineOverride{ov("all", "vllm", "cu13", "", nil), ov("h100", "vllm", "none", "", map[string]string{"nvidia.com/gpu.product": "H100"})}, "n1", a10, "cu13", "all", 0, false},
		{"node beats group", []EngineOverride{ov("z-node", "vllm", "none", "n1", nil), ov("a10", "vllm", "cu129", "", a10)}, "n1", a10, "none", "z-node", 0, false},
		{"other node's", []EngineOverride{ov("n2", "vllm", "none", "n2", nil)}, "n1", a10, "", "", 0, false},
		{"tie by name", []EngineOverride{ov("b", "vllm", "cu13", "", a10), ov("a", "vllm", "cu129", "", a10)}, "n1", a10, "cu129", "a", 1, false},
		{"bad choice wins with its error", []EngineOverride{ov("all", "vllm", "cu13", "", nil), ov("a10", "vllm", "not a choice!", "", a10)}, "n1", a10, "not a choice!", "a10", 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, rej := Resolve(c.ovs, c.node, c.labels)
			if len(rej) != 0 {
				t.Fatalf("rejections: %+v", rej)
			}
			r, ok := got["vllm"]
			if c.want == "" {
				if ok {
					t.Fatalf("want no override, got %+v", r)
				}
				return
			}
			if !ok || r.Choice != c.want || r.Name != c.from || len(r.Shadowed) != c.shadowed || (r.Err != nil) != c.bad {
				t.Fatalf("got %+v (err %v), want %s from %s, %d shadowed, bad %v", r, r.Err, c.want, c.from, c.shadowed, c.bad)
			}
		})
	}
}

func TestResolveBadSelectorIsRejected(t *testing.T) {
	o := ov("bad", "vllm", "cu13", "", nil)
	o.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Sometimes"}}}
	got, rej := Resolve([]EngineOverride{o}, "n1", nil)
	if len(got) != 0 || len(rej) != 1 || rej[0].Source != "EngineOverride bad" {
		t.Fatalf("got %+v, rejections %+v", got, rej)
	}
}
