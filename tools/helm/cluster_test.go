//go:build cluster

package helm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/canary"
	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/node"
)

const (
	nfdNamespace = "node-feature-discovery"
	clusterPause = "registry.k8s.io/pause:3.10"
	engine       = "vllm"
	engineVer    = "0.11.0"
	// The nodes: an H100 on driver 580 (CUDA 13.0) proves cu13; a V100 on
	// 535 proves nothing, as vLLM's builds since CUDA 12.8 have no Volta
	// kernels (its TORCH_CUDA_ARCH_LIST starts at 7.5).
	nodeH100 = "gpu-h100"
	nodeV100 = "gpu-v100"
)

// gpupin as users install it, on a real cluster: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, two kubelets registered as
// Nodes over two containerds (each node in a mount namespace of its own,
// so the chart's host paths are each node's), nfd-worker on each node and
// nfd-master, a local registry. gpupin's image, as `make image` builds it,
// is pushed there; the chart is installed with Helm's Go packages; the
// controllers make every pod. Nothing of gpupin runs as a static pod or a
// host process. The node facts are SIMULATED (the chart's
// simulated.nodeFile): no GPU here.
//
// Seen: the DaemonSet's pods Ready on both nodes; each agent, in its
// container, pulls, probes (containers of the node's containerd, the probe
// programs at host paths), pins and writes its GPUPinNode and Events;
// nfd-master labels the H100 node from the agent's feature file; the
// engine Deployment's pods are placed by the scheduler only on the node
// that proved the engine and run the proved digest, and the replica with
// nowhere to go says why. Then day two: helm upgrade to a newer gpupin
// image proves nothing again; kubectl logs shows the agent's JSON lines;
// kubectl wait on the GPUPinNode's Ready condition; helm uninstall leaves
// pins and engine pods alone and a re-install picks them up; a socket that
// is not there crash-loops the agent with one clear line; an agent killed
// mid-probe leaves nothing once its successor runs; deleting a Node
// removes its GPUPinNode by garbage collection.
func TestClusterSimulated(t *testing.T) {
	testStart := time.Now()
	ctx := context.Background()
	for _, b := range []string{"nfd-worker", "nfd-master", "nfd-api-crds.yaml"} {
		if _, err := os.Stat(filepath.Join(tools(), b)); err != nil {
			t.Fatalf("%s missing (%v): run scripts/deps.sh", b, err)
		}
	}
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })

	// gpupin's image, twice: the release installed, and the one upgraded to.
	repo := reg.Host + "/gpupin/gpupin"
	buildImage(t, repo, "0.1.0")
	buildImage(t, repo, "0.1.1")
	entry := []string{"/bin/sh", "-c", `mkdir -p /tmp/www && echo ok >/tmp/www/health && ` +
		`echo "engine $0 CUDA_VERSION=$CUDA_VERSION args: $*" && exec /bin/busybox httpd -f -p 8000 -h /tmp/www`, engine}
	archs := "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"
	variants := []sandbox.EngineVariant{
		{Name: "cu13", CUDA: "13.0", Archs: archs, Entrypoint: entry},
		{Name: "cu129", CUDA: "12.9", Archs: archs, Entrypoint: entry},
	}
	if _, err := sandbox.PublishEngine(ctx, reg.Host, engine, engineVer, variants); err != nil {
		t.Fatal(err)
	}

	c, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if err := c.StartControllers(); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(c.Admin())
	dyn := dynamic.NewForConfigOrDie(c.Admin())
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nfdNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.ApplyFiles(ctx, c.Admin(), filepath.Join(tools(), "nfd-api-crds.yaml")); err != nil {
		t.Fatal(err)
	}

	h100 := &node.Facts{Driver: "580.95.05", CUDA: "13.0", Platform: "linux/amd64", Simulated: true,
		GPUs: []node.GPU{{Index: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "NVIDIA H100 80GB HBM3", Brand: "nvidia", CC: "9.0", MemoryMiB: 81559}}}
	v100 := &node.Facts{Driver: "535.261.03", CUDA: "12.2", Platform: "linux/amd64", Simulated: true,
		GPUs: []node.GPU{{Index: 0, UUID: "GPU-66666666-7777-8888-9999-000000000000", Name: "Tesla V100-SXM2-16GB", Brand: "nvidia", CC: "7.0", MemoryMiB: 16384}}}
	nodes := map[string]*simNode{
		nodeH100: startSimNode(t, c, nodeH100, h100, reg.Host, clusterPause),
		nodeV100: startSimNode(t, c, nodeV100, v100, reg.Host, clusterPause),
	}
	// nfd-master annotates the Node it runs on: the H100's, as its pod
	// could be placed there.
	startNFDMaster(t, c, nodeH100)
	t.Logf("cluster of 2 nodes up (containerd %s) after %s", nodes[nodeH100].ctd.Version, time.Since(testStart).Round(time.Second))
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s kubelet:\n%s\nnfd-worker:\n%s\ncontainerd:\n%s", n.name, n.kubelet.LogTail(), n.nfdLog(), n.ctd.LogTail())
			}
			for _, f := range []string{"kube-controller-manager.log", "kube-scheduler.log", "nfd-master.log"} {
				t.Logf("%s:\n%s", f, tailFile(filepath.Join(c.Dir, f)))
			}
			t.Logf("the test failed (its first failure is above these logs); the last wait: %s", lastWait)
		}
	})

	h := newHelm(t, c)
	values := clusterValues(t, c, repo, "0.1.0", reg.Host)
	installStart := time.Now()
	h.install(t, values)
	waitDaemonSet(t, cs, 2, "0.1.0", repo)
	t.Logf("helm install -> both agents Ready: %s", time.Since(installStart).Round(100*time.Millisecond))

	key := engine + ":" + engineVer
	label, want := agent.FeatureLabel(engine, engineVer, "cu13")
	pinned := waitEngine(t, dyn, nodeH100, key, func(e fleet.EngineStatus) bool { return e.Variant == "cu13" && e.Pinned != "" })
	if !strings.HasPrefix(pinned.Pinned, reg.Host+"/"+engine+"@sha256:") || !pinned.Simulated {
		t.Fatalf("%s: pinned %q (simulated %v): want %s/%s@sha256:… and simulated", nodeH100, pinned.Pinned, pinned.Simulated, reg.Host, engine)
	}
	refused := waitEngine(t, dyn, nodeV100, key, func(e fleet.EngineStatus) bool {
		return e.Pinned == "" && e.State != "" && e.State != "pending" && e.State != "provisioning"
	})
	t.Logf("%s: %s %s pinned %s; %s: %s (%s)", nodeH100, key, pinned.Variant, pinned.Pinned, nodeV100, refused.State, refused.Detail)
	pin, err := nodes[nodeH100].rt.GetPin(ctx, key)
	if err != nil || pin == nil || pin.Ref != pinned.Pinned {
		t.Fatalf("%s: the pin in containerd %+v (%v) is not the status's %s", nodeH100, pin, err, pinned.Pinned)
	}
	if pin, err := nodes[nodeV100].rt.GetPin(ctx, key); err != nil || pin != nil {
		t.Fatalf("%s: pin %+v (%v): it proved nothing", nodeV100, pin, err)
	}
	// The H100 was its GPU class's canary for the version (the chart's
	// default): its lease, in the release's namespace, says done, held by
	// it, for its class.
	waitFor(t, 30*time.Second, "the H100's canary lease", func() (bool, string) {
		ls, err := cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: canary.LabelCanary + "=true"})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, l := range ls.Items {
			holder := ""
			if l.Spec.HolderIdentity != nil {
				holder = *l.Spec.HolderIdentity
			}
			a := l.Annotations
			seen = append(seen, fmt.Sprintf("%s holder=%s class=%q key=%s state=%s", l.Name, holder, a[canary.AnnotationClass], a[canary.AnnotationKey], a[canary.AnnotationState]))
			if holder == nodeH100 && a[canary.AnnotationKey] == key && strings.Contains(a[canary.AnnotationClass], "H100") && a[canary.AnnotationState] == "done" {
				t.Logf("canary lease %s", seen[len(seen)-1])
				return true, ""
			}
		}
		return false, fmt.Sprintf("canary leases: %v", seen)
	})
	// The agents' Events, written through their pod-bound tokens.
	waitFor(t, 30*time.Second, "the agent's Events", func() (bool, string) {
		evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == nodeH100 && strings.Contains(e.Message, engine) && e.Source.Component != "kubelet" {
				t.Logf("Event on %s/%s: %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, none from gpupin about %s", len(evs.Items), nodeH100)
	})
	// nfd-master's label, from the agent's feature file through nfd-worker.
	waitFor(t, 60*time.Second, "the NFD label", func() (bool, string) {
		nd, err := cs.CoreV1().Nodes().Get(ctx, nodeH100, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return nd.Labels[label] == want, fmt.Sprintf("%s labels %v", nodeH100, nd.Labels)
	})
	if nd, err := cs.CoreV1().Nodes().Get(ctx, nodeV100, metav1.GetOptions{}); err != nil || nd.Labels[label] != "" {
		t.Fatalf("%s: label %s=%q (%v): it proved nothing", nodeV100, label, nd.Labels[label], err)
	}
	kubectlWait(t, c, nodeH100)

	// The engine's Deployment as deploy/kubernetes has it: 2 replicas, one
	// GPU each. The H100 node has one GPU: one replica runs there, the
	// other has nowhere to go (the V100 node lacks the proof's label).
	deploy := engineDeploymentFor(t)
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running, pending := waitEnginePods(t, cs, deploy, pin.Ref)
	t.Logf("helm install -> engine pod %s Running and Ready on %s: %s", running.Name, running.Spec.NodeName, time.Since(installStart).Round(100*time.Millisecond))
	t.Logf("the replica with no proved node: %s", pending)

	// Day two. kubectl logs ds/gpupin-agent: the agent's JSON log lines.
	logs := kubectl(t, c, "logs", "-n", namespace, "ds/gpupin-agent", "--tail=50")
	checkJSONLog(t, logs)

	// helm upgrade to a newer gpupin: the DaemonSet rolls, nothing is
	// proved or pulled again.
	reg.Reset()
	upgradeStart := time.Now()
	h.upgrade(t, clusterValues(t, c, repo, "0.1.1", reg.Host))
	waitDaemonSet(t, cs, 2, "0.1.1", repo)
	t.Logf("helm upgrade -> both agents Ready again: %s", time.Since(upgradeStart).Round(100*time.Millisecond))
	again := waitEngine(t, dyn, nodeH100, key, func(e fleet.EngineStatus) bool { return e.Pinned != "" })
	if again.Pinned != pinned.Pinned || !again.ProvedAt.Equal(pinned.ProvedAt) {
		t.Errorf("after the upgrade: pinned %s proved %v; before %s proved %v", again.Pinned, again.ProvedAt, pinned.Pinned, pinned.ProvedAt)
	}
	expectNoEnginePulls(t, reg, pin.Ref)
	if p, err := nodes[nodeH100].rt.GetPin(ctx, key); err != nil || p == nil || p.Ref != pin.Ref {
		t.Errorf("after the upgrade the pin is %+v (%v), was %s", p, err, pin.Ref)
	}

	// helm uninstall: the agents go; the pins and the engine's pod stay.
	h.uninstall(t)
	waitFor(t, 120*time.Second, "the agents' pods gone", func() (bool, string) {
		pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods left", len(pods.Items))
	})
	if p, err := nodes[nodeH100].rt.GetPin(ctx, key); err != nil || p == nil || p.Ref != pin.Ref {
		t.Fatalf("after helm uninstall the pin is %+v (%v), was %s", p, err, pin.Ref)
	}
	if pod, err := cs.CoreV1().Pods("default").Get(ctx, running.Name, metav1.GetOptions{}); err != nil || pod.Status.Phase != corev1.PodRunning || pod.UID != running.UID {
		t.Fatalf("after helm uninstall the engine's pod: %v", err)
	}
	// A re-install picks the pins up: Ready again, nothing pulled.
	reg.Reset()
	h.install(t, clusterValues(t, c, repo, "0.1.1", reg.Host))
	waitDaemonSet(t, cs, 2, "0.1.1", repo)
	again = waitEngine(t, dyn, nodeH100, key, func(e fleet.EngineStatus) bool { return e.Pinned != "" })
	if again.Pinned != pinned.Pinned || !again.ProvedAt.Equal(pinned.ProvedAt) {
		t.Errorf("after the re-install: pinned %s proved %v; before %s proved %v", again.Pinned, again.ProvedAt, pinned.Pinned, pinned.ProvedAt)
	}
	expectNoEnginePulls(t, reg, pin.Ref)

	// Bad input: a socket that is not there, then the agent killed while
	// a probe runs.
	checkBadSocket(t, c, h, clusterValues(t, c, repo, "0.1.1", reg.Host), nodes[nodeH100], key, pin.Ref)
	checkKilledMidProbe(t, c, h, dyn, clusterValues(t, c, repo, "0.1.1", reg.Host), nodes[nodeH100], reg.Host, key, pin.Ref)

	// kubectl delete node: its GPUPinNode goes by garbage collection (its
	// kubelet stopped first, or it would register the Node again).
	gone, err := dyn.Resource(fleet.GPUPinNodes).Get(ctx, nodeV100, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodes[nodeV100].kubelet.Stop()
	kubectl(t, c, "delete", "node", nodeV100)
	waitFor(t, 60*time.Second, "GPUPinNode "+nodeV100+" collected", func() (bool, string) {
		got, err := dyn.Resource(fleet.GPUPinNodes).Get(ctx, nodeV100, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err == nil && got.GetUID() != gone.GetUID() {
			return false, "recreated, by an agent still running"
		}
		return false, fmt.Sprint("still there: ", err)
	})
	t.Logf("the cluster test took %s", time.Since(testStart).Round(time.Second))
}

// buildImage runs deploy/image/build.sh (what `make image` runs) for
// repo:version and pushes the index it wrote to the registry.
func buildImage(t *testing.T, repo, version string) {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("../../deploy/image/build.sh", out, repo, version)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/image/build.sh: %v\n%s", err, b)
	}
	lp, err := layout.FromPath(filepath.Join(out, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("%s: %d manifests (%v): want the index", out, len(im.Manifests), err)
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(repo+":"+version, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
}

// clusterValues are the only values the test sets: the pods on the host's
// network with no metrics port (no CNI; two nodes share one host's ports),
// no nvidia runtime class, the node's containerd socket, its SIMULATED
// facts, the engine wanted, and the API server's address for in-cluster
// clients (no kube-proxy serves the kubernetes Service here).
func clusterValues(t *testing.T, c *kubetest.Cluster, repo, version, regHost string) map[string]any {
	t.Helper()
	port := strings.TrimPrefix(c.Host, "https://127.0.0.1:")
	text := fmt.Sprintf(`
image: {repository: %q, tag: %q}
hostNetwork: true
runtimeClassName: ""
metrics: {port: 0}
containerd: {socket: %q}
simulated: {nodeFile: %q}
wants:
  - {engine: %s, version: %s, ref: "%s/%s:%s"}
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
  - {name: KUBERNETES_SERVICE_PORT, value: %q}
`, repo, version, simSocket, simNodeFile, engine, engineVer, regHost, engine, engineVer, port)
	var v map[string]any
	if err := yaml.Unmarshal([]byte(text), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// helmClient is Helm's library, as the helm command drives it.
type helmClient struct{ cfg *action.Configuration }

func newHelm(t *testing.T, c *kubetest.Cluster) *helmClient {
	t.Helper()
	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kc, &ns
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, ns, "secret"); err != nil {
		t.Fatal(err)
	}
	return &helmClient{cfg: cfg}
}

func (h *helmClient) install(t *testing.T, values map[string]any) {
	t.Helper()
	in := action.NewInstall(h.cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace = "gpupin", namespace, true
	in.WaitStrategy, in.Timeout = kube.HookOnlyStrategy, 2*time.Minute
	r, err := in.RunWithContext(context.Background(), loadChart(t), values)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	if rel := r.(*release.Release); rel.Info.Status != "deployed" {
		t.Fatalf("helm install: %s", rel.Info.Status)
	}
}

func (h *helmClient) upgrade(t *testing.T, values map[string]any) {
	t.Helper()
	up := action.NewUpgrade(h.cfg)
	up.Namespace, up.WaitStrategy, up.Timeout = namespace, kube.HookOnlyStrategy, 2*time.Minute
	r, err := up.RunWithContext(context.Background(), "gpupin", loadChart(t), values)
	if err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	if rel := r.(*release.Release); rel.Info.Status != "deployed" {
		t.Fatalf("helm upgrade: %s", rel.Info.Status)
	}
}

func (h *helmClient) uninstall(t *testing.T) {
	t.Helper()
	un := action.NewUninstall(h.cfg)
	un.WaitStrategy = kube.HookOnlyStrategy
	if _, err := un.Run("gpupin"); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
}

// waitDaemonSet waits until the agent's DaemonSet has rolled out version
// to n nodes and all are Ready, and checks each pod runs that image.
func waitDaemonSet(t *testing.T, cs kubernetes.Interface, n int32, version, repo string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 3*time.Minute, "DaemonSet gpupin-agent rolled out", func() (bool, string) {
		ds, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "gpupin-agent", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st := ds.Status
		done := st.ObservedGeneration == ds.Generation && st.DesiredNumberScheduled == n &&
			st.UpdatedNumberScheduled == n && st.NumberReady == n && st.NumberAvailable == n
		if done {
			pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpupin-agent"})
			if err != nil {
				return false, err.Error()
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil || p.Spec.Containers[0].Image != repo+":"+version {
					return false, "old pods still there"
				}
			}
		}
		return done, fmt.Sprintf("%+v%s", st, podProblems(cs, namespace))
	})
}

// podProblems says why the namespace's pods are not Ready, in the words
// their statuses and Events use.
func podProblems(cs kubernetes.Interface, ns string) string {
	ctx := context.Background()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\n  pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, "; %s: %s %s", c.Type, c.Reason, c.Message)
			}
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil {
				fmt.Fprintf(&b, "; %s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			}
			if s.LastTerminationState.Terminated != nil {
				fmt.Fprintf(&b, "; %s exited %d", s.Name, s.LastTerminationState.Terminated.ExitCode)
			}
		}
	}
	evs, _ := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if evs != nil {
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning {
				fmt.Fprintf(&b, "\n  event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	return b.String()
}

// waitEngine waits until node's GPUPinNode has the engine in a state ok
// accepts, and returns it.
func waitEngine(t *testing.T, dyn dynamic.Interface, nodeName, key string, ok func(fleet.EngineStatus) bool) fleet.EngineStatus {
	t.Helper()
	var found fleet.EngineStatus
	waitFor(t, 3*time.Minute, "GPUPinNode "+nodeName+" "+key, func() (bool, string) {
		u, err := dyn.Resource(fleet.GPUPinNodes).Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var gpn fleet.GPUPinNode
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &gpn); err != nil {
			return false, err.Error()
		}
		for _, e := range gpn.Status.Engines {
			if e.Key == key && ok(e) {
				found = e
				return true, ""
			}
		}
		b, _ := json.Marshal(gpn.Status)
		return false, string(b)
	})
	return found
}

// engineDeploymentFor is deploy/kubernetes/engine-deployment.yaml on the
// host's network (no CNI here); nothing else is changed.
func engineDeploymentFor(t *testing.T) *appsv1.Deployment {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(plainDir, "engine-deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		t.Fatalf("engine-deployment.yaml: %v", err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Fatalf("engine-deployment.yaml: replicas %v, want 2", d.Spec.Replicas)
	}
	d.Namespace = "default"
	d.Spec.Template.Spec.HostNetwork = true
	return &d
}

// waitEnginePods waits until one of the Deployment's pods runs, Ready, on
// the H100 node from the pinned digest (kubelet's imageID), and the other
// is refused by the scheduler with a reason that names the affinity; it
// returns the running pod and the scheduler's words for the other.
func waitEnginePods(t *testing.T, cs kubernetes.Interface, d *appsv1.Deployment, pinnedRef string) (*corev1.Pod, string) {
	t.Helper()
	ctx := context.Background()
	var run *corev1.Pod
	var why string
	waitFor(t, 2*time.Minute, "the engine's pods", func() (bool, string) {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + d.Name})
		if err != nil {
			return false, err.Error()
		}
		run, why = nil, ""
		for i, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					why = c.Message
				}
			}
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			if p.Status.Phase == corev1.PodRunning && ready {
				run = &pods.Items[i]
			}
		}
		return run != nil && why != "", podProblems(cs, "default")
	})
	if run.Spec.NodeName != nodeH100 {
		t.Fatalf("engine pod %s runs on %s, which did not prove it", run.Name, run.Spec.NodeName)
	}
	if got := run.Status.ContainerStatuses[0].ImageID; got != pinnedRef {
		t.Fatalf("engine pod %s: kubelet's imageID %s, gpupin pinned %s", run.Name, got, pinnedRef)
	}
	// The V100 node for want of the proof's label; the H100 one because
	// its one replica slot is taken (on the host's network the pod's port
	// is the node's; else its one GPU).
	if !strings.Contains(why, "1 node(s) didn't match Pod's node affinity/selector") ||
		!(strings.Contains(why, "Insufficient nvidia.com/gpu") || strings.Contains(why, "didn't have free ports")) {
		t.Errorf("the unplaced replica's PodScheduled message %q does not say why each node refused it", why)
	}
	pods, _ := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + d.Name})
	for _, p := range pods.Items {
		if p.Spec.NodeName == nodeV100 {
			t.Fatalf("engine pod %s placed on %s, which proved nothing", p.Name, nodeV100)
		}
	}
	dep, err := cs.AppsV1().Deployments("default").Get(ctx, d.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Deployment %s: %d/%d available; conditions %s", d.Name, dep.Status.AvailableReplicas, *dep.Spec.Replicas, deploymentConditions(dep))
	return run, why
}

func deploymentConditions(d *appsv1.Deployment) string {
	var s []string
	for _, c := range d.Status.Conditions {
		s = append(s, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(s, "; ")
}

// expectNoEnginePulls: since the registry's log was reset, no layer of
// the engine was fetched, nor the pinned manifest. Reads of the index
// (the want's tag, resolved by an agent that starts: the V100 node,
// which has no pin, tries again) are logged, not refused.
func expectNoEnginePulls(t *testing.T, reg *sandbox.Registry, pinnedRef string) {
	t.Helper()
	_, pinned, _ := strings.Cut(pinnedRef, "@")
	var resolved int
	for _, r := range reg.Requests() {
		if !strings.HasPrefix(r.Path, "/v2/"+engine+"/") || r.Method != "GET" {
			continue
		}
		switch {
		case r.Kind() == "blob", r.Kind() == "manifest" && strings.HasSuffix(r.Path, "/"+pinned):
			t.Errorf("the engine was pulled again: %s %s", r.Method, r.Path)
		case r.Kind() == "manifest":
			resolved++
		}
	}
	t.Logf("registry since the reset: no layer or pinned manifest read; %d reads of the index", resolved)
}

// kubectl runs the real kubectl as the admin and returns its standard
// output (its notes, "Found 2 pods, using …", go to stderr); a failure
// fails the test.
func kubectl(t *testing.T, c *kubetest.Cluster, args ...string) string {
	t.Helper()
	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig=" + kc}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// kubectlWait is `kubectl wait --for=condition=Ready gpupinnode/NODE`.
func kubectlWait(t *testing.T, c *kubetest.Cluster, nodeName string) {
	t.Helper()
	out := kubectl(t, c, "wait", "--for=condition=Ready", "gpupinnode/"+nodeName, "--timeout=60s")
	t.Logf("kubectl wait: %s", strings.TrimSpace(out))
	t.Logf("kubectl get gpupinnodes:\n%s", kubectl(t, c, "get", "gpupinnodes"))
}

// checkJSONLog: every line is a JSON object with slog's time, level and msg.
func checkJSONLog(t *testing.T, logs string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if len(lines) < 2 {
		t.Fatalf("kubectl logs ds/gpupin-agent: %d lines:\n%s", len(lines), logs)
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("kubectl logs ds/gpupin-agent: not JSON: %q: %v", l, err)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := rec[k]; !ok {
				t.Fatalf("kubectl logs ds/gpupin-agent: %q lacks %q", l, k)
			}
		}
	}
	t.Logf("kubectl logs ds/gpupin-agent: %d JSON lines, the last: %s", len(lines), lines[len(lines)-1])
}

// startNFDMaster runs nfd-master as the admin: it turns the workers'
// NodeFeature objects into Node labels.
func startNFDMaster(t *testing.T, c *kubetest.Cluster, nodeName string) {
	t.Helper()
	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(c.Dir, "nfd-master.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(tools(), "nfd-master"), "-kubeconfig="+kc, "-metrics=0", "-grpc-health=0", "-v=2")
	cmd.Env = append(os.Environ(), "KUBERNETES_NAMESPACE="+nfdNamespace, "NODE_NAME="+nodeName)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
}
