package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
)

var fleetManifests = []string{"../../deploy/kubernetes/fleet-crds.yaml", "../../deploy/kubernetes/fleet-rbac.yaml"}

// plan --node-name names the EngineOverride a choice comes from, and
// `gpupin fleet` prints the nodes × engines table and the GPU × driver ×
// variant matrix from GPUPinNode objects, against a real API server.
func TestFleetAndPlanFromTheClusterSimulated(t *testing.T) {
	c := kubetest.StartT(t, fleetManifests)
	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kube, err := kubernetes.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	a10 := map[string]string{"nvidia.com/gpu.product": "NVIDIA-A10"}
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-07", Labels: a10}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eo := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gpupin.io/v1alpha1", "kind": "EngineOverride",
		"metadata": map[string]any{"name": "a10-fallback"},
		"spec":     map[string]any{"engine": "vllm", "choice": "cu129", "nodeSelector": map[string]any{"matchLabels": map[string]any{"nvidia.com/gpu.product": "NVIDIA-A10"}}}}}
	if _, err := dyn.Resource(fleet.EngineOverrides).Create(ctx, eo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	w := newChoiceWorld(t)
	h575 := w.nodeFile(t, "h575", factsH100on575)
	out, msg, code := choiceRun(t, "--overrides", filepath.Join(w.dir, "none.yaml"), "plan", w.engine, "--node", h575,
		"--node-name", "gpu-07", "--kubeconfig", kc)
	if code != exitOK || !strings.Contains(out, "override: cu129, from EngineOverride a10-fallback (group)") {
		t.Fatalf("plan: exit %d (%s):\n%s", code, msg, out)
	}
	// Another node, not an A10: the file (none here) decides.
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-01"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, _, _ = choiceRun(t, "--overrides", filepath.Join(w.dir, "none.yaml"), "plan", w.engine, "--node", h575, "--node-name", "gpu-01", "--kubeconfig", kc)
	if !strings.Contains(out, "override: auto, from default") {
		t.Fatalf("plan on gpu-01:\n%s", out)
	}

	// Three nodes' statuses, as their agents write them.
	put := func(name string, st fleet.NodeStatus) { putStatus(t, dyn, name, st) }
	now := metav1.Now()
	probeFail := &fleet.Failure{Reason: "ProbeFailed", Message: "no GPUPIN-PROBE line", At: now}
	put("h100-a", fleet.NodeStatus{Driver: "580.82.07", CUDA: "13.0", GPUs: []string{"NVIDIA H100"}, Simulated: true,
		Engines: []fleet.EngineStatus{{Key: "vllm:0.11.0", State: "ready", Variant: "cu13", At: now}}})
	put("h100-b", fleet.NodeStatus{Driver: "580.82.07", CUDA: "13.0", GPUs: []string{"NVIDIA H100"}, Simulated: true,
		Engines: []fleet.EngineStatus{{Key: "vllm:0.11.0", State: "failed", Attempted: "cu13", LastFailure: probeFail, At: now}}})
	put("a10-a", fleet.NodeStatus{Driver: "575.57.08", CUDA: "12.9", GPUs: []string{"NVIDIA A10"}, Simulated: true,
		Engines: []fleet.EngineStatus{{Key: "vllm:0.11.0", State: "ready", Variant: "cu129", Override: "cu129", At: now}}})
	out, msg, code = choiceRun(t, "fleet", "--kubeconfig", kc)
	if code != exitOK {
		t.Fatalf("fleet: exit %d (%s)", code, msg)
	}
	t.Logf("gpupin fleet:\n%s", out)
	for _, want := range []string{
		"VLLM:0.11.0",
		"a10-a (SIMULATED)", "ready/cu129 [cu129]",
		"h100-b (SIMULATED)", "failed:ProbeFailed",
		"NVIDIA H100  580.82.07  cu13     1       1       ProbeFailed×1",
		"NVIDIA A10   575.57.08  cu129    1       0       -",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("fleet output lacks %q", want)
		}
	}
	out, _, code = choiceRun(t, "fleet", "--kubeconfig", kc, "--json")
	var js struct {
		Nodes  []fleet.GPUPinNode `json:"nodes"`
		Matrix []fleet.MatrixRow  `json:"matrix"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &js) != nil || len(js.Nodes) != 3 || len(js.Matrix) != 2 {
		t.Fatalf("fleet --json: exit %d\n%s", code, out)
	}
}
