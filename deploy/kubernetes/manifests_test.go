// Package kubernetes_test checks the manifests against the names gpupin
// makes: the Deployment's local image name and node label are the ones
// the agent keeps, and the DaemonSet names the image `make image` builds.
package kubernetes_test

import (
	"os"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/deploycheck"
)

func load(t *testing.T, file string) []deploycheck.Object {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploycheck.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return objs
}

func TestEngineDeploymentUsesTheLocalNameAndTheLabel(t *testing.T) {
	objs := load(t, "engine-deployment.yaml")
	if len(objs) != 1 || objs[0].Kind != "Deployment" {
		t.Fatalf("want one Deployment, got %+v", objs)
	}
	spec := objs[0].Spec.Template.Spec
	local, err := containerd.LocalName(containerd.DefaultLocalPrefix, "vllm:0.11.0")
	if err != nil {
		t.Fatal(err)
	}
	label, _ := agent.FeatureLabel("vllm", "0.11.0", "cu13")
	if len(spec.Containers) != 1 || spec.Containers[0].Image != local || spec.Containers[0].ImagePullPolicy != "Never" {
		t.Fatalf("containers %+v: want image %s, imagePullPolicy Never", spec.Containers, local)
	}
	terms := spec.Affinity.NodeAffinity.Required.Terms
	if len(terms) != 1 || len(terms[0].Expressions) != 1 || terms[0].Expressions[0].Key != label || terms[0].Expressions[0].Operator != "Exists" {
		t.Fatalf("node affinity %+v: want %s Exists", terms, label)
	}
}

// The DaemonSet runs the image `make image` builds, in containerd's CRI
// namespace, with NFD's features.d mounted; its wants are ones the agent
// accepts. (The Helm chart's test holds its render to the same.)
func TestDaemonSetNamesTheImageAndMountsTheFeatureDir(t *testing.T) {
	image, err := deploycheck.MakeImage("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	cfg, errs := deploycheck.CheckAgent(load(t, "daemonset.yaml"), deploycheck.Agent{
		Image: image, Namespace: containerd.CRINamespace, FeaturesDir: agent.DefaultNFDFeaturesDir})
	for _, err := range errs {
		t.Error(err)
	}
	if cfg == nil || len(cfg.Wants) == 0 || cfg.Wants[0].Version != "0.11.0" {
		t.Errorf("the wants do not name vllm's version: %+v", cfg)
	}
}

// The systemd unit's namespace is the CLI's default, and a file an
// operator edits (and sources in the shell) can change both.
func TestSystemdUnitNamespace(t *testing.T) {
	data, err := os.ReadFile("../systemd/gpupin-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	env := strings.Index(unit, "Environment=CONTAINERD_NAMESPACE=gpupin\n")
	file := strings.Index(unit, "EnvironmentFile=-/etc/gpupin/environment\n")
	// systemd: an EnvironmentFile's settings win over Environment=.
	if env < 0 || file < 0 {
		t.Fatalf("the unit sets CONTAINERD_NAMESPACE=gpupin at %d, reads /etc/gpupin/environment at %d:\n%s", env, file, unit)
	}
	if !strings.Contains(unit, "CONTAINERD_NAMESPACE=k8s.io") {
		t.Error("the unit does not say which namespace kubelet and a mirror read")
	}
}

// The cluster-side guard of the local names: a policy for pods and one
// for pod templates, each bound with Deny, matching what they must, and
// testing the prefix gpupin writes. (Its CEL is evaluated by a real API
// server in policy_test.go.)
func TestLocalNamesPolicy(t *testing.T) {
	data, err := os.ReadFile("local-names-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := deploycheck.Split(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 4 {
		t.Errorf("%d documents, want two policies and their bindings", len(docs))
	}
	for _, err := range deploycheck.CheckLocalNamesPolicy(docs, containerd.DefaultLocalPrefix) {
		t.Error(err)
	}
}
