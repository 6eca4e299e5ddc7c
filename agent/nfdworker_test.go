package agent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// nfdWorker is node-feature-discovery's nfd-worker (scripts/nfd-worker.sh
// builds it into testenv.ToolsDir()); missing, the test fails.
func nfdWorker(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nfd-worker"); err == nil {
		return p
	}
	p := filepath.Join(testenv.ToolsDir(), "nfd-worker")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("nfd-worker is not installed (scripts/nfd-worker.sh, which scripts/deps.sh runs, builds it into %s): %v", testenv.ToolsDir(), err)
	}
	return p
}

// runNFDWorker runs `nfd-worker -oneshot -no-publish` with only its local
// source, on dir as its features.d, and returns the labels it found and
// its log. Its features.d is fixed (/etc/kubernetes/node-feature-
// discovery/features.d), so it runs in a mount namespace of its own where
// dir is bound there; -no-publish still wants a kubeconfig, which it never
// uses.
func runNFDWorker(t *testing.T, dir string) (map[string]string, string) {
	t.Helper()
	testenv.RequireRoot(t)
	bin := nfdWorker(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:1'}}]\n"+
		"contexts: [{name: none, context: {cluster: none, user: none}}]\ncurrent-context: none\nusers: [{name: none, user: {}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const fd = "/etc/kubernetes/node-feature-discovery/features.d"
	script := `set -e; mount --make-rprivate /; mount -t tmpfs tmpfs /etc; mkdir -p ` + fd + `; mount --bind "$1" ` + fd + `; shift; exec "$@"`
	cmd := exec.Command("unshare", "-m", "sh", "-c", script, "sh", dir, bin, "-oneshot", "-no-publish", "-kubeconfig="+kubeconfig,
		"-feature-sources=local", "-label-sources=local", "-config=/dev/null", "-metrics=0", "-grpc-health=0", "-v=2") // labels are logged from -v=1
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nfd-worker: %v\n%s", err, out)
	}
	// The labels are logged as a YAML block:
	//   "feature discovery completed" labels=<
	//   	gpupin.io/demo-1.0: cu129
	//    >
	log := string(out)
	_, block, ok := strings.Cut(log, `"feature discovery completed" labels=<`)
	if !ok {
		t.Fatalf("nfd-worker did not complete a discovery:\n%s", log)
	}
	labels := map[string]string{}
	for _, line := range strings.Split(block, "\n")[1:] {
		if strings.TrimSpace(line) == ">" {
			break
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		labels[k] = v
	}
	return labels, log
}

// node-feature-discovery's own worker reads the file the agent writes:
// every line a label, exactly as the agent means it, none refused, for
// engine names and versions that are not label-safe as they stand.
func TestNFDWorkerReadsTheFeatureFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "features.d")
	f, err := agent.NewFeatureFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 70)
	sts := []provision.Status{
		ready("demo", "1.0", "cu129"),
		ready("vllm", "0.11.0+cu129", "cu129"), // '+' is no label character
		ready(long, "1.0", "cu13"),             // over 63 characters
		ready("a-b", "c", "cu13"),              // these two would meet as a-b-c
		ready("a", "b-c", "cu129"),
		ready("sglang", "0.5.0", "cu12.9+ptx"), // a value made label-safe
	}
	if _, err := f.Sync(sts); err != nil {
		t.Fatal(err)
	}
	got, log := runNFDWorker(t, dir)
	want := nfdLabels(t, dir)
	if len(want) != len(sts) {
		t.Fatalf("the file has %d labels for %d engines: %v", len(want), len(sts), want)
	}
	if !equalMaps(got, want) {
		t.Errorf("nfd-worker labels:\n%v\nthe file says:\n%v\nlog:\n%s", got, want, log)
	}
	if name, value := agent.FeatureLabel("demo", "1.0", "cu129"); got[name] != value || name != "gpupin.io/demo-1.0" {
		t.Errorf("nfd-worker has %s=%q; want gpupin.io/demo-1.0=cu129", name, got[name])
	}
	if strings.Contains(log, "ignoring label") || strings.Contains(log, "failed to read file") {
		t.Errorf("nfd-worker refused part of the file:\n%s", log)
	}
}
