package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// `gpupin agent --node-name` against a real kube-apiserver: an agent
// started after an EngineOverride exists provisions under it from its
// first pass (none: nothing is pulled), then follows a change to cu129
// and reports it in its GPUPinNode, as the node's own user.
func TestCLIAgentFleetSimulated(t *testing.T) {
	const nodeName = "e2e-cli"
	c := kubetest.StartT(t, []string{"../deploy/kubernetes/fleet-crds.yaml", "../deploy/kubernetes/fleet-rbac.yaml"},
		kubetest.User{Name: "gpupin:agent:" + nodeName, Groups: []string{"gpupin:agents"}})
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(c.Admin())
	dyn := dynamic.NewForConfigOrDie(c.Admin())
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eo := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gpupin.io/v1alpha1", "kind": "EngineOverride",
		"metadata": map[string]any{"name": "cli-node"}, "spec": map[string]any{"engine": "eng", "choice": "none", "nodeName": nodeName}}}
	if _, err := dyn.Resource(fleet.EngineOverrides).Create(ctx, eo, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc, err := c.Kubeconfig("gpupin:agent:" + nodeName)
	if err != nil {
		t.Fatal(err)
	}

	reg := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "eng", "3.0", []sandbox.EngineVariant{testenv.CU13, testenv.CU129}); err != nil {
		t.Fatal(err)
	}
	cl := newCLI(t, reg)
	conf := filepath.Join(cl.dir, "agent.yaml")
	os.WriteFile(conf, []byte("wants:\n  - ref: "+reg.Host+"/eng:3.0\n"), 0o644)
	args := append(append([]string{}, cl.base...), "agent", "--config", conf, "--socket", filepath.Join(cl.dir, "agent.sock"),
		"--nfd-features-dir", "", "--runc-root", testenv.Containerd(t).RuncRoot, "--probe-dir", filepath.Join(cl.dir, "probe"),
		"--node-name", nodeName, "--kubeconfig", kc, "--fleet-cache", filepath.Join(cl.dir, "cluster-overrides.json"))
	agentCmd := exec.Command(gpupinBin, args...)
	logf, _ := os.Create(filepath.Join(cl.dir, "agent.log"))
	agentCmd.Stdout, agentCmd.Stderr = logf, logf
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		agentCmd.Process.Signal(syscall.SIGTERM)
		agentCmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(cl.dir, "agent.log"))
			t.Logf("agent log:\n%s", b)
		}
	}()

	cell := func() string {
		u, err := dyn.Resource(fleet.GPUPinNodes).Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		engines, _, _ := unstructured.NestedSlice(u.Object, "status", "engines")
		if len(engines) != 1 {
			return ""
		}
		m := engines[0].(map[string]any)
		s, _ := m["state"].(string)
		if v, _ := m["variant"].(string); v != "" {
			s += "/" + v
		}
		return s
	}
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for cell() != want {
			if time.Now().After(deadline) {
				t.Fatalf("GPUPinNode %s: %q, want %q", nodeName, cell(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("disabled")
	// From the first pass under none: nothing was pulled.
	if out, code := cl.run("pins"); code != 0 || strings.Contains(out, "eng:3.0") {
		t.Fatalf("pins under none (exit %d):\n%s", code, out)
	}
	u, err := dyn.Resource(fleet.EngineOverrides).Get(ctx, "cli-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructured.SetNestedField(u.Object, "cu129", "spec", "choice")
	if _, err := dyn.Resource(fleet.EngineOverrides).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("ready/cu129")
}
