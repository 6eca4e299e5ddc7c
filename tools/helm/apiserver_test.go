package helm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
)

// `helm install gpupin deploy/helm/gpupin -n gpupin-system
// --create-namespace`, through Helm's library, on a real kube-apiserver:
// the CRDs, the RBAC, the policies and the DaemonSet are accepted, and the
// installed policies work: agent A's pod-bound token writes node A's
// GPUPinNode and not node B's, and a pod naming gpupin.local/ without
// imagePullPolicy: Never is refused. (No controller manager or kubelet
// runs: the DaemonSet makes no pods.)
func TestInstallOnARealAPIServer(t *testing.T) {
	ctx := context.Background()
	c := kubetest.StartT(t, nil)
	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kc
	flags.Namespace = &ns
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, ns, "secret"); err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(cfg)
	in.ReleaseName = "gpupin"
	in.Namespace = ns
	in.CreateNamespace = true
	in.WaitStrategy = kube.HookOnlyStrategy
	in.Timeout = 2 * time.Minute
	start := time.Now()
	r, err := in.RunWithContext(ctx, loadChart(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	rel := r.(*release.Release)
	t.Logf("installed in %s: %s", time.Since(start).Round(time.Millisecond), rel.Info.Status)
	if rel.Info.Status != "deployed" {
		t.Fatalf("release %s", rel.Info.Status)
	}

	cs, err := kubernetes.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	// What the release made is there, as the render named it.
	rendered, err := render(t, ns, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "gpupin-agent", metav1.GetOptions{}); err != nil ||
		got.Spec.Template.Spec.Containers[0].Image != makeImage(t) {
		t.Fatalf("DaemonSet: %v", err)
	}
	if !strings.Contains(rendered.Manifest, "kind: ValidatingAdmissionPolicy") {
		t.Fatal("the render has no policy")
	}
	for _, name := range []string{"gpupin-agent-own-node", "gpupin-local-names-pods", "gpupin-local-names-templates"} {
		if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("policy %s: %v", name, err)
		}
		if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("binding %s: %v", name, err)
		}
	}

	// Agent A, as the DaemonSet's pod on node-a authenticates.
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-node-a"},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "gpupin-agent", AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: makeImage(t)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "gpupin-agent", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agentDyn, err := dynamic.NewForConfig(c.Config(tr.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	gpn := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "gpupin.io/v1alpha1", "kind": "GPUPinNode", "metadata": map[string]any{"name": name}}}
	}
	// A policy takes effect a moment after it is created: retry the first
	// refusal.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := agentDyn.Resource(fleet.GPUPinNodes).Create(ctx, gpn("node-b"), metav1.CreateOptions{})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only its own node") {
			break
		}
		if err == nil {
			dyn.Resource(fleet.GPUPinNodes).Delete(ctx, "node-b", metav1.DeleteOptions{})
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent A creating node B's GPUPinNode: want Forbidden by the own-node policy, got %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := agentDyn.Resource(fleet.GPUPinNodes).Create(ctx, gpn("node-a"), metav1.CreateOptions{}); err != nil {
		t.Errorf("agent A creating its own GPUPinNode: %v", err)
	}
	other, err := dyn.Resource(fleet.GPUPinNodes).Create(ctx, gpn("node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other.Object["status"] = map[string]any{"driver": "forged"}
	if _, err := agentDyn.Resource(fleet.GPUPinNodes).UpdateStatus(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent A writing node B's status: want Forbidden, got %v", err)
	}
	if _, err := agentDyn.Resource(fleet.EngineOverrides).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("agent A reading the overrides: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(c.Config(tr.Status.Token)).CoreV1().ConfigMaps(ns).Get(ctx, "gpupin-agent", metav1.GetOptions{}); err != nil {
		t.Errorf("agent A reading its wants: %v", err)
	}

	// The local-names guard: each policy takes effect on its own, so the
	// refusal is retried as above.
	createPod := func(policy corev1.PullPolicy) error {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "engine-"},
			Spec: corev1.PodSpec{ServiceAccountName: "gpupin-agent", AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{Name: "vllm", Image: "gpupin.local/vllm:0.11.0", ImagePullPolicy: policy}}}}, metav1.CreateOptions{})
		return err
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		err := createPod(corev1.PullIfNotPresent)
		if err != nil && strings.Contains(err.Error(), "gpupin.local") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pod naming gpupin.local/ with IfNotPresent: want refused by the policy, got %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := createPod(corev1.PullNever); err != nil {
		t.Errorf("a pod naming gpupin.local/ with Never: %v", err)
	}

	// And it goes: helm uninstall.
	un := action.NewUninstall(cfg)
	un.WaitStrategy = kube.HookOnlyStrategy
	if _, err := un.Run("gpupin"); err != nil {
		t.Errorf("uninstall: %v", err)
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "gpupin-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall the DaemonSet: %v", err)
	}
}
