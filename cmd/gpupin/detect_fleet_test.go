package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// detect, against a real containerd, says what matters on a node of a
// fleet: whether pulls keep layer blobs for peers (a mirror in the hosts
// configuration), whether a mirror could serve the node-local names (and
// what to add to its filters), and whether the namespace is the one
// kubelet and a peer-to-peer mirror read.
func TestDetectFleetNotesSimulated(t *testing.T) {
	d, _ := testenv.OwnContainerd(t, sandbox.ContainerdOptions{})
	w := &choiceWorld{dir: t.TempDir()}
	facts := w.nodeFile(t, "h", factsH100on580)
	spegel := "[host.\"http://127.0.0.1:30020\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	none := t.TempDir()
	everywhere := testenv.HostsToml(t, "", "_default", spegel)
	oneRegistry := testenv.HostsToml(t, "", "registry.example", "server = \"https://registry.example\"\n"+spegel)
	tests := []struct {
		name, hosts, ns string
		out             []string
		not             []string
	}{
		{"no mirror, the CLI's namespace", none, "gpupin", []string{
			"namespace: kubelet and a peer-to-peer mirror (Spegel) read only k8s.io", "--namespace k8s.io",
			"no mirror is configured for gpupin.local"}, []string{"WARNING"}},
		{"a mirror for every registry", everywhere, "k8s.io", []string{
			"namespace: kubelet sees the pins", "local names: WARNING", `^gpupin\.local/`, "registryFilters",
			"every registry without a directory of its own (_default): http://127.0.0.1:30020"}, nil},
		{"a mirror for one registry", oneRegistry, "k8s.io", []string{
			"registry.example: http://127.0.0.1:30020", "no mirror is configured for gpupin.local"}, []string{"WARNING"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--address", d.Address, "--namespace", tc.ns, "--hosts-dir", tc.hosts, "detect", "--node", facts}
			out, msg, code := choiceRun(t, args...)
			if code != exitOK {
				t.Fatalf("exit %d (%s):\n%s", code, msg, out)
			}
			t.Logf("containerd %s:\n%s", d.Version, out)
			for _, s := range tc.out {
				if !strings.Contains(out, s) {
					t.Errorf("detect lacks %q", s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(out, s) {
					t.Errorf("detect says %q", s)
				}
			}
			if !strings.Contains(out, "layers:      ") {
				t.Errorf("detect says nothing of layer blobs")
			}
			out, msg, code = choiceRun(t, append(args, "--json")...)
			if code != exitOK {
				t.Fatalf("--json: exit %d (%s):\n%s", code, msg, out)
			}
			var got struct {
				Namespace struct {
					Name       string `json:"name"`
					Kubernetes bool   `json:"kubernetes"`
				} `json:"namespace"`
				Layers struct {
					Summary  string `json:"summary"`
					Mirrored []struct {
						Registry string `json:"registry"`
					} `json:"mirrored"`
				} `json:"layers"`
				LocalNames struct {
					Prefix  string `json:"prefix"`
					Warning string `json:"warning"`
				} `json:"local_names"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			if got.Namespace.Name != tc.ns || got.Namespace.Kubernetes != (tc.ns == "k8s.io") {
				t.Errorf("namespace %+v, want %s", got.Namespace, tc.ns)
			}
			if got.Layers.Summary == "" || (len(got.Layers.Mirrored) > 0) != (tc.hosts != none) {
				t.Errorf("layers %+v", got.Layers)
			}
			if got.LocalNames.Prefix != "gpupin.local" || (got.LocalNames.Warning != "") != (tc.hosts == everywhere) {
				t.Errorf("local names %+v", got.LocalNames)
			}
		})
	}
}
