package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// The pause image kubelet's pods get: registry.k8s.io cannot be reached
// here, so an image of the test's own (it sleeps) takes a pause name of
// the kind a node's CRI config names, as the CRI plugin's sandbox image
// (pinned, on 2.x).
const kubeletPause = "registry.k8s.io/pause:3.10"

// The pod of deploy/kubernetes/engine-deployment.yaml, run by a real
// kubelet (standalone, static pods) over containerd's CRI plugin, on a
// simulated node where gpupin proved the engine the manifest names: the
// container runs from gpupin.local/ENGINE:VERSION, and kubelet reports its
// imageID as the digest gpupin pinned; the manifest's args reach the
// variant that was proved. A pod naming an engine the node did not prove
// never runs: ErrImageNeverPull, because of imagePullPolicy: Never.
//
// On every daemon make test runs: Debian's 1.6 and 1.7.35 (CRI config
// version 2, one plugin) and 2.1.9 and 2.4.2 (version 3, the split plugins);
// internal/sandbox writes either. Kubelet 1.37 still runs on a CRI without
// RuntimeConfig (1.x), taking cgroupDriver from its own config.
func TestKubeletRunsTheProvedEngineSimulated(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	ctx := context.Background()
	deploy := engineDeployment(t)
	tmpl := deploy.Spec.Template
	if len(tmpl.Spec.Containers) != 1 {
		t.Fatalf("engine-deployment.yaml: %d containers, want the engine's one", len(tmpl.Spec.Containers))
	}
	engineCtr := tmpl.Spec.Containers[0]
	if engineCtr.ImagePullPolicy != corev1.PullNever {
		t.Fatalf("engine-deployment.yaml: imagePullPolicy %q: the local name must never be pulled", engineCtr.ImagePullPolicy)
	}
	key, ok := strings.CutPrefix(engineCtr.Image, containerd.DefaultLocalPrefix+"/")
	engine, version, ok2 := strings.Cut(key, ":")
	if !ok || !ok2 {
		t.Fatalf("engine-deployment.yaml: image %q is not %s/ENGINE:VERSION", engineCtr.Image, containerd.DefaultLocalPrefix)
	}

	e := newCRIEnv(t, kubeletPause)
	// A pod's args replace the image's Cmd: the engine's entrypoint says
	// what it got and which variant it is, then serves until told to stop
	// (sh as PID 1 ignores SIGTERM without a trap, and kubelet would wait
	// out the grace period).
	entry := []string{"/bin/sh", "-c", `echo "engine $0 CUDA_VERSION=$CUDA_VERSION args: $*"; trap "exit 0" TERM; sleep 3600 & wait`, engine}
	cu13, cu129 := testenv.CU13, testenv.CU129
	cu13.Entrypoint, cu129.Entrypoint = entry, entry
	if _, err := sandbox.PublishEngine(ctx, e.reg.Host, engine, version, []sandbox.EngineVariant{cu13, cu129}); err != nil {
		t.Fatal(err)
	}
	// Driver 575 supports CUDA 12.9: cu13 is rejected, cu129 is proved.
	p := testenv.Provisioner(t, e.rt, provision.WithNode(testenv.NewNode(testenv.H100("575.57.08", "12.9"))),
		provision.WithOverrides(provision.NoOverrides()), provision.WithLockDir(filepath.Join(e.dir, "locks")),
		provision.WithProbeTimeout(30*time.Second), provision.WithProbeDir(filepath.Join(e.dir, "probe")))
	st := p.Provision(ctx, provision.Want{Engine: engine, Version: version, Ref: e.reg.Host + "/" + engine + ":" + version})
	if st.State != provision.Ready || st.Variant != "cu129" {
		t.Fatalf("provision: %v; want cu129 ready", st)
	}
	if pin, err := e.rt.GetPin(ctx, key); err != nil || pin == nil || pin.Ref != st.Pinned || pin.Local != engineCtr.Image {
		t.Fatalf("pin %+v, %v: want %s under the manifest's %s", pin, err, st.Pinned, engineCtr.Image)
	}

	// The label node-feature-discovery would publish from the agent's
	// feature file: the manifest's node affinity asks for it, and a
	// standalone kubelet checks a pod's affinity against its own labels.
	label, value := agent.FeatureLabel(engine, version, st.Variant)
	const node = "gpupin-e2e"
	k := kubetest.StartKubelet(t, kubetest.KubeletOptions{Endpoint: e.d.CRIEndpoint(), NodeName: node, Labels: map[string]string{label: value}})
	t.Cleanup(func() { stopKubeletPods(t, e, k) })

	// No CNI on this node: the pod takes the host's network. The manifest
	// leaves networking to the cluster; nothing else is changed.
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: deploy.Name, Namespace: "default", Labels: tmpl.Labels}, Spec: *tmpl.Spec.DeepCopy()}
	pod.Spec.HostNetwork = true
	if err := k.WriteStaticPod(pod); err != nil {
		t.Fatal(err)
	}
	cs := waitContainer(t, k, pod.Name+"-"+node, func(cs corev1.ContainerStatus) bool { return cs.State.Running != nil })
	t.Logf("containerd %s: kubelet runs %s: image %s, imageID %s", e.d.Version, cs.Name, cs.Image, cs.ImageID)
	if cs.ImageID != st.Pinned {
		t.Fatalf("kubelet reports imageID %s; gpupin pinned %s", cs.ImageID, st.Pinned)
	}
	// What ran: the proved cu129 image, with the manifest's args.
	want := fmt.Sprintf("engine %s CUDA_VERSION=12.9.0 args: %s", engine, strings.Join(engineCtr.Args, " "))
	var logs string
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs, want) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine's log lacks %q:\n%s", want, logs)
		}
		time.Sleep(100 * time.Millisecond)
		logs = podLogs(k, pod.Name+"-"+node)
	}
	if err := k.RemoveStaticPod(pod.Name); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, k, pod.Name+"-"+node)

	// A pod naming an engine this node never proved (one the scheduler
	// would keep away: without its label the node affinity fails, so the
	// affinity is dropped, as for a pod placed by hand): no local name, and
	// kubelet, told never to pull, does not start it.
	other := &corev1.Pod{TypeMeta: pod.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: "unproved", Namespace: "default"}, Spec: *pod.Spec.DeepCopy()}
	other.Spec.Affinity = nil
	other.Spec.Containers[0].Image = containerd.DefaultLocalPrefix + "/unproved:1.0"
	if err := k.WriteStaticPod(other); err != nil {
		t.Fatal(err)
	}
	cs = waitContainer(t, k, "unproved-"+node, func(cs corev1.ContainerStatus) bool {
		return cs.State.Waiting != nil && cs.State.Waiting.Reason == "ErrImageNeverPull"
	})
	t.Logf("containerd %s: %s waits: %s: %s", e.d.Version, cs.Image, cs.State.Waiting.Reason, cs.State.Waiting.Message)
}

// engineDeployment is deploy/kubernetes/engine-deployment.yaml, read
// strictly: a field the Deployment type does not know fails the test.
func engineDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	data, err := os.ReadFile("../deploy/kubernetes/engine-deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		t.Fatalf("engine-deployment.yaml: %v", err)
	}
	if d.Kind != "Deployment" {
		t.Fatalf("engine-deployment.yaml: kind %q", d.Kind)
	}
	return &d
}

// waitContainer waits until kubelet's /pods shows the pod's one container
// as ok says, and returns its status.
func waitContainer(t *testing.T, k *kubetest.Kubelet, pod string, ok func(corev1.ContainerStatus) bool) corev1.ContainerStatus {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for {
		pods, err := k.Pods(context.Background())
		last = fmt.Sprint(err)
		for _, p := range pods {
			if p.Name != pod {
				continue
			}
			last = fmt.Sprintf("phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
			if len(p.Status.ContainerStatuses) == 1 && ok(p.Status.ContainerStatuses[0]) {
				return p.Status.ContainerStatuses[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: %s\nkubelet log:\n%s", pod, last, k.LogTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitPodGone(t *testing.T, k *kubetest.Kubelet, pod string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pods, err := k.Pods(context.Background())
		found := false
		for _, p := range pods {
			found = found || p.Name == pod
		}
		if err == nil && !found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet still has pod %s (%v)\n%s", pod, err, k.LogTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// podLogs is what kubelet's log files hold for the pod's containers
// (podLogsDir/NAMESPACE_NAME_UID/CONTAINER/N.log).
func podLogs(k *kubetest.Kubelet, pod string) string {
	files, _ := filepath.Glob(filepath.Join(k.LogsDir, "default_"+pod+"_*", "*", "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

// stopKubeletPods takes the static pods away and waits until kubelet has
// stopped them, stops kubelet, then removes what kubelet leaves to its
// garbage collection (sandboxes and exited containers) through CRI, so the
// daemon's teardown finds nothing running; it fails the test if anything
// is left.
func stopKubeletPods(t *testing.T, e *criEnv, k *kubetest.Kubelet) {
	files, _ := filepath.Glob(filepath.Join(k.StaticPods, "*.yaml"))
	for _, f := range files {
		os.Remove(f)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		pods, err := k.Pods(context.Background())
		if err == nil && len(pods) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("kubelet still runs %d pods (%v)", len(pods), err)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	k.Stop()
	// A kubelet stopped while a container's shim exits leaves containerd
	// a moment behind ("ttrpc: closed", seen once at load 10): the removal
	// is tried again until that moment passes, then nothing may be left.
	var ctrs, sbs, rmOut string
	var err1, err2, rmErr error
	for try := 0; try < 10; try++ {
		rmOut, rmErr = e.crictl("rmp", "--all", "--force")
		ctrs, err1 = e.crictl("ps", "--all", "--quiet")
		sbs, err2 = e.crictl("pods", "--quiet")
		if rmErr == nil && err1 == nil && err2 == nil && strings.TrimSpace(ctrs) == "" && strings.TrimSpace(sbs) == "" {
			return
		}
		time.Sleep(time.Second)
	}
	if rmErr != nil {
		t.Errorf("crictl rmp --all --force: %v: %s", rmErr, rmOut)
	}
	t.Errorf("left after kubelet: containers %q, pods %q (%v, %v)", ctrs, sbs, err1, err2)
}
