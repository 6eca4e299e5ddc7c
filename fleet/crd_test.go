package fleet_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// An API server without gpupin's CRDs (the chart's crds/ skipped, or a
// cluster upgraded past them): the agent says so once per resource, at
// Error, with the fix, rather than retrying 404s silently or calling the
// API unreachable; once the CRDs are applied, the status is written.
func TestMissingCRDReportedSimulated(t *testing.T) {
	c := kubetest.StartT(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name = "no-crd"
	dyn, kube := clients(t, c.Admin())
	mkNode(t, kube, name, nil)
	var logs testenv.LogBuffer
	a := newFakeAgent()
	a.sts = []provision.Status{{Key: "vllm:0.11.0", Engine: "vllm", Version: "0.11.0", State: provision.Ready,
		Variant: "cu13", Pinned: "reg.example/vllm@sha256:" + strings.Repeat("a", 64), Simulated: true, At: time.Now()}}
	n, err := fleet.NewNode(fleet.NodeOptions{Config: c.Admin(), NodeName: name, SyncTimeout: 2 * time.Second,
		StatusEvery: 200 * time.Millisecond, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		Facts: node.Static{Facts: &node.Facts{Driver: "580.82.07", CUDA: "13.0", Simulated: true,
			GPUs: []node.GPU{{Name: "NVIDIA H100", CC: "9.0"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx, a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Wait)
	t.Cleanup(cancel)

	said := []string{
		`"msg":"GPUPinNode status cannot be written until its CRD is installed; retrying"`,
		`"msg":"EngineOverrides cannot be read; the node's own overrides hold until they can"`,
	}
	deadline := time.Now().Add(30 * time.Second)
	for !containsAll(logs.String(), said) {
		if time.Now().After(deadline) {
			t.Fatalf("no clear word of the missing CRDs in 30s:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Several status writes and reflector retries later, still one line each.
	time.Sleep(3 * time.Second)
	out := logs.String()
	for _, s := range said {
		if got := strings.Count(out, s); got != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", s, got, out)
		}
	}
	for _, s := range []string{"CustomResourceDefinition not installed", "kubectl apply -f deploy/kubernetes/fleet-crds.yaml",
		"gpupinnodes.gpupin.io", "engineoverrides.gpupin.io"} {
		if !strings.Contains(out, s) {
			t.Errorf("the log does not say %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "not answering") || strings.Contains(out, "status not written; retrying") {
		t.Errorf("a missing CRD reported as something else:\n%s", out)
	}

	if err := kubetest.ApplyFiles(ctx, c.Admin(), "../deploy/kubernetes/fleet-crds.yaml"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		n.StatusChanged(a.sts[0])
		u, err := dyn.Resource(fleet.GPUPinNodes).Get(ctx, name, metav1.GetOptions{})
		if err == nil && u.Object["status"] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status written after the CRDs were applied (%v):\n%s", err, logs.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "GPUPinNode CRD installed: status written") {
		t.Errorf("the recovery is not said:\n%s", logs.String())
	}
}

func containsAll(s string, subs []string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
