package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// The file is read as nfd-worker's local source documents and implements
// it (nfdworker_test.go checks it against nfd-worker itself): every file in features.d whose name
// does not start with '.', at most 64 KiB, lines trimmed, '#' lines
// comments ("# +" a directive, of which gpupin writes none), `name[=value]`
// otherwise, value "true" when absent; a name is a label only with a
// namespace, and the label must pass Kubernetes' rules: a DNS subdomain
// prefix of at most 253 characters, a name part and a value of at most 63,
// alphanumeric at both ends with '-', '_', '.' between.
var (
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	k8sNameRE      = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
)

func nfdLabels(t *testing.T, dir string) map[string]string {
	return readNFDLabels(t, dir, true)
}

// nfdLabelsLive reads labels while the agent may be writing: a dot-file
// is then its write in flight, not one left behind.
func nfdLabelsLive(t *testing.T, dir string) map[string]string {
	return readNFDLabels(t, dir, false)
}

func readNFDLabels(t *testing.T, dir string, quiet bool) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			if quiet {
				t.Errorf("a dot-file is left in features.d: %s", e.Name())
			}
			continue
		}
		path := filepath.Join(dir, e.Name())
		st, err := os.Stat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if st.Size() > 64<<10 {
			t.Fatalf("%s is %d bytes: nfd-worker ignores files over 64 KiB", path, st.Size())
		}
		if st.Mode().Perm()&0o044 != 0o044 {
			t.Errorf("%s is mode %v: nfd-worker may not read it", path, st.Mode().Perm())
		}
		data, _ := os.ReadFile(path)
		for _, raw := range strings.Split(string(data), "\n") {
			line := strings.TrimSpace(raw)
			if line == "" || strings.HasPrefix(line, "#") {
				if strings.HasPrefix(line, "# +") {
					t.Errorf("%s: an NFD directive gpupin did not mean: %q", path, line)
				}
				continue
			}
			name, value, ok := strings.Cut(line, "=")
			if !ok {
				value = "true"
			}
			prefix, part, ok := strings.Cut(name, "/")
			if !ok || len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix) {
				t.Errorf("%s: %q has no valid label namespace", path, name)
			}
			if len(part) > 63 || !k8sNameRE.MatchString(part) {
				t.Errorf("%s: %q is not a valid label name", path, name)
			}
			if value != "" && (len(value) > 63 || !k8sNameRE.MatchString(value)) {
				t.Errorf("%s: %q is not a valid label value", path, value)
			}
			labels[name] = value
		}
	}
	return labels
}

func TestFeatureLabel(t *testing.T) {
	long := strings.Repeat("1.", 63) + "9"
	tests := []struct {
		engine, version, variant string
		name, value              string // "" = made label-safe: only checked for validity
	}{
		{"vllm", "0.11.0", "cu129", "gpupin.io/vllm-0.11.0", "cu129"},
		{"llama.cpp", "b4500", "cu13", "gpupin.io/llama.cpp-b4500", "cu13"},
		{"sglang", "0.5.0rc1", "cu12.9-hopper", "gpupin.io/sglang-0.5.0rc1", "cu12.9-hopper"},
		{"vllm", "0.11.0+cu129", "cu129", "", "cu129"},
		{"eng", "sha256:0123456789a", "cu13", "", "cu13"},
		{"vllm", long, "cu13", "", "cu13"},
		{"trt-llm-", "_1", "cu13", "", "cu13"},
		{"vllm", "1.0", strings.Repeat("cu13", 16), "gpupin.io/vllm-1.0", ""},
	}
	seen := map[string]string{}
	for _, tc := range tests {
		t.Run(tc.engine+":"+tc.version, func(t *testing.T) {
			name, value := agent.FeatureLabel(tc.engine, tc.version, tc.variant)
			if tc.name != "" && name != tc.name || tc.value != "" && value != tc.value {
				t.Fatalf("FeatureLabel = %s=%s, want %s=%s", name, value, tc.name, tc.value)
			}
			part, ok := strings.CutPrefix(name, agent.NFDLabelPrefix)
			if !ok || !agent.ValidLabelName(part) || len(part) > 63 || !k8sNameRE.MatchString(part) {
				t.Fatalf("label name %q is not valid", name)
			}
			if !agent.ValidLabelValue(value) || len(value) > 63 || !k8sNameRE.MatchString(value) {
				t.Fatalf("label value %q is not valid", value)
			}
			if again, v2 := agent.FeatureLabel(tc.engine, tc.version, tc.variant); again != name || v2 != value {
				t.Fatalf("not stable: %s=%s then %s=%s", name, value, again, v2)
			}
			if other, ok := seen[name]; ok && other != tc.engine+":"+tc.version {
				t.Fatalf("%s and %s share %s", other, tc.engine+":"+tc.version, name)
			}
			seen[name] = tc.engine + ":" + tc.version
		})
	}
	// A version the mapping changes never meets one it keeps.
	a, _ := agent.FeatureLabel("vllm", "1.0+a", "cu13")
	b, _ := agent.FeatureLabel("vllm", "1.0_a", "cu13")
	if a == b {
		t.Fatalf("two keys share %s", a)
	}
}

func ready(engine, version, variant string) provision.Status {
	return provision.Status{Key: engine + ":" + version, Engine: engine, Version: version, Ref: "reg.example/" + engine + ":" + version,
		State: provision.Ready, Variant: variant}
}

// The file follows the statuses: a line per ready engine, none for the
// others; written whole through a dot-file; an engine not yet looked at
// after a restart keeps its line; labels that would meet are told apart.
func TestFeatureFileFollowsTheStatuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "features.d") // made on the first write
	f, err := agent.NewFeatureFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	failed := ready("x", "1", "cu13")
	failed.State, failed.Pinned = provision.Failed, "reg.example/x@sha256:0"
	steps := []struct {
		name string
		sts  []provision.Status
		want map[string]string
	}{
		{"two ready, one failed", []provision.Status{ready("vllm", "0.11.0", "cu129"), ready("sglang", "0.5.0", "cu13"), failed},
			map[string]string{"gpupin.io/vllm-0.11.0": "cu129", "gpupin.io/sglang-0.5.0": "cu13"}},
		{"a new variant", []provision.Status{ready("vllm", "0.11.0", "cu13"), ready("sglang", "0.5.0", "cu13")},
			map[string]string{"gpupin.io/vllm-0.11.0": "cu13", "gpupin.io/sglang-0.5.0": "cu13"}},
		{"one no longer wanted", []provision.Status{ready("vllm", "0.11.0", "cu13")},
			map[string]string{"gpupin.io/vllm-0.11.0": "cu13"}},
		{"being proved again", []provision.Status{func() provision.Status {
			s := ready("vllm", "0.11.0", "cu13")
			s.State = provision.Probing
			return s
		}()}, map[string]string{}},
		{"ready again", []provision.Status{ready("vllm", "0.11.0", "cu13")}, map[string]string{"gpupin.io/vllm-0.11.0": "cu13"}},
	}
	for _, st := range steps {
		if _, err := f.Sync(st.sts); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := nfdLabels(t, dir); !equalMaps(got, st.want) {
			t.Fatalf("%s: labels %v, want %v", st.name, got, st.want)
		}
	}
	if wrote, err := f.Sync(steps[len(steps)-1].sts); err != nil || wrote {
		t.Fatalf("the same statuses wrote again (%v, %v)", wrote, err)
	}
	// Someone removed it: the next sync puts it back.
	os.Remove(filepath.Join(dir, agent.NFDFileName))
	if wrote, err := f.Sync(steps[len(steps)-1].sts); err != nil || !wrote {
		t.Fatalf("a removed file was not written again (%v, %v)", wrote, err)
	}

	// A restart: pending engines keep their lines until their first pass
	// says otherwise.
	f2, err := agent.NewFeatureFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	pending := provision.Status{Key: "vllm:0.11.0", Engine: "vllm", Version: "0.11.0", Ref: "reg.example/vllm:0.11.0", State: provision.Pending}
	f2.Sync([]provision.Status{pending})
	if got := nfdLabels(t, dir); got["gpupin.io/vllm-0.11.0"] != "cu13" {
		t.Fatalf("a restart took the label of a pending engine: %v", got)
	}
	pending.State = provision.Resolving
	f2.Sync([]provision.Status{pending})
	if got := nfdLabels(t, dir); len(got) != 0 {
		t.Fatalf("an engine without a pin keeps its label: %v", got)
	}

	// Engine a-b version c and engine a version b-c.
	f.Sync([]provision.Status{ready("a-b", "c", "cu13"), ready("a", "b-c", "cu129")})
	got := nfdLabels(t, dir)
	if len(got) != 2 || got["gpupin.io/a-b-c"] != "" {
		t.Fatalf("two engines share a label: %v", got)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// An agent on a real loop, containerd and registry: the label appears
// when the engine is ready (from its pin), and goes when it is no longer
// wanted.
func TestAgentSimulatedWritesNFDFeatureFile(t *testing.T) {
	reg, rt := testenv.Registry(t), testenv.Runtime(t)
	if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu13, cu129}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "features.d")
	var a *agent.Agent
	p := testenv.Provisioner(t, rt, provision.WithNode(node.Static{Facts: h100("575.57.08", "12.9")}),
		provision.WithOverrides(provision.NewOverrides()), provision.WithLockDir(t.TempDir()),
		provision.WithProbeTimeout(30*time.Second), provision.WithProbeDir(t.TempDir()))
	loop := provision.NewLoop(p, provision.LoopOptions{OnChange: func(st provision.Status) { a.StatusChanged(st) }})
	a = agent.New(loop, rt, agent.Options{NFDFeaturesDir: dir, SweepEvery: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); loop.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	if err := a.SetWants([]provision.Want{{Engine: "demo", Version: "1.0", Ref: reg.Host + "/demo:1.0"}}); err != nil {
		t.Fatal(err)
	}
	waitLabels := func(what string, want map[string]string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := map[string]string{}
			if _, err := os.Stat(filepath.Join(dir, agent.NFDFileName)); err == nil {
				got = nfdLabelsLive(t, dir)
			}
			if equalMaps(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: labels %v, want %v (status %v)", what, got, want, a.Status())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLabels("ready", map[string]string{"gpupin.io/demo-1.0": "cu129"})
	pins, err := rt.Pins(context.Background())
	if err != nil || len(pins) != 1 || pins[0].Local != "gpupin.local/demo:1.0" {
		t.Fatalf("pins %+v, %v: want one with its local name", pins, err)
	}

	// Another client deletes the pin and its local name (kubelet's image
	// GC on containerd 1.6): the agent's timer puts both back.
	wg.Add(1)
	go func() { defer wg.Done(); a.Maintain(ctx) }()
	nsctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	is := rt.Client().ImageService()
	for _, name := range []string{pins[0].Ref, pins[0].Local} {
		if err := is.Delete(nsctx, name, images.SynchronousDelete()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err1 := is.Get(nsctx, pins[0].Ref)
		_, err2 := is.Get(nsctx, pins[0].Local)
		if err1 == nil && err2 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not restore the deleted pin: %v, %v", err1, err2)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := rt.GetPin(context.Background(), "demo:1.0"); err != nil || got == nil || got.Restored.IsZero() || got.Variant != "cu129" {
		t.Fatalf("restored pin %+v, %v", got, err)
	}

	if err := a.SetWants(nil); err != nil {
		t.Fatal(err)
	}
	waitLabels("no longer wanted", map[string]string{})
}
