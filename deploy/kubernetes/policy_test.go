package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/internal/kubetest"
)

// local-names-policy.yaml, applied to a real kube-apiserver, refuses a pod
// or a pod template that names a node-local image (gpupin.local/…) with
// any pull policy but Never — such a pod could pull another node's proof
// through a peer-to-peer mirror — and lets everything else through.
func TestLocalNamesPolicyOnARealAPIServer(t *testing.T) {
	ctx := context.Background()
	c := kubetest.StartT(t, []string{"local-names-policy.yaml"})
	cs, err := kubernetes.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount admission plugin wants the namespace's default
	// account, which no controller makes here.
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	spec := func(image string, policy corev1.PullPolicy, init bool) corev1.PodSpec {
		ctr := corev1.Container{Name: "c", Image: image, ImagePullPolicy: policy}
		s := corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1", ImagePullPolicy: corev1.PullIfNotPresent}}}
		if init {
			s.InitContainers = []corev1.Container{ctr}
		} else {
			s.Containers = []corev1.Container{ctr}
		}
		return s
	}
	n := 0
	createPod := func(s corev1.PodSpec) error {
		n++
		_, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p" + time.Now().Format("150405") + "-" + string(rune('a'+n))}, Spec: s}, metav1.CreateOptions{})
		return err
	}
	createDeployment := func(s corev1.PodSpec) error {
		n++
		labels := map[string]string{"app": "d"}
		_, err := cs.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "d" + time.Now().Format("150405") + "-" + string(rune('a'+n))},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: s}},
		}, metav1.CreateOptions{})
		return err
	}

	// A policy takes effect a moment after it is created, each on its
	// own: wait for the first refusal by each.
	for _, first := range []struct {
		what   string
		create func(corev1.PodSpec) error
	}{{"pod", createPod}, {"deployment", createDeployment}} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := first.create(spec("gpupin.local/vllm:0.11.0", corev1.PullIfNotPresent, false))
			if err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a %s naming gpupin.local/ with IfNotPresent was still admitted after 20 s", first.what)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, tc := range []struct {
		name    string
		create  func(corev1.PodSpec) error
		spec    corev1.PodSpec
		refused bool
	}{
		{"pod, IfNotPresent", createPod, spec("gpupin.local/vllm:0.11.0", corev1.PullIfNotPresent, false), true},
		{"pod, Always", createPod, spec("gpupin.local/vllm:0.11.0", corev1.PullAlways, false), true},
		{"pod, policy left to its default", createPod, spec("gpupin.local/vllm:0.11.0", "", false), true},
		{"pod, init container", createPod, spec("gpupin.local/vllm:0.11.0", corev1.PullIfNotPresent, true), true},
		{"pod, Never", createPod, spec("gpupin.local/vllm:0.11.0", corev1.PullNever, false), false},
		{"pod, another image", createPod, spec("registry.example/vllm:0.11.0", corev1.PullIfNotPresent, false), false},
		{"deployment, IfNotPresent", createDeployment, spec("gpupin.local/vllm:0.11.0", corev1.PullIfNotPresent, false), true},
		{"deployment, Never", createDeployment, spec("gpupin.local/vllm:0.11.0", corev1.PullNever, false), false},
	} {
		err := tc.create(tc.spec)
		switch {
		case tc.refused && err == nil:
			t.Errorf("%s: admitted", tc.name)
		case tc.refused && !strings.Contains(err.Error(), "gpupin.local"):
			t.Errorf("%s: refused, but not by the policy: %v", tc.name, err)
		case !tc.refused && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		}
	}
}
