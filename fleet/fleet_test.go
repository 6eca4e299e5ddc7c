package fleet_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	runtimeconv "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

var cluster *kubetest.Cluster

// Static agents outside pods: user gpupin:agent:NODE in group gpupin:agents.
var agentUsers = []kubetest.User{
	{Name: "gpupin:agent:node-a", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:node-b", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:e2e-h100", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:e2e-a10", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:e2e-v100", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:own-new", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:own-old", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:own-late", Groups: []string{"gpupin:agents"}},
	{Name: "gpupin:agent:cond-a", Groups: []string{"gpupin:agents"}},
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	c, err := kubetest.Start(agentUsers...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster = c
	ctx := context.Background()
	if err := kubetest.ApplyFiles(ctx, c.Admin(), "../deploy/kubernetes/fleet-crds.yaml", "../deploy/kubernetes/fleet-rbac.yaml"); err != nil {
		fmt.Fprintln(os.Stderr, "apply the manifests:", err)
		c.Stop()
		os.Exit(1)
	}
	// The end-to-end test's containerds and probe programs.
	code := testenv.Run(m)
	c.Stop()
	os.Exit(code)
}

func needCluster(t *testing.T) {
	t.Helper()
	if cluster == nil {
		t.Skip("-short: no API server")
	}
}

func clients(t *testing.T, cfg *rest.Config) (dynamic.Interface, kubernetes.Interface) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, kube
}

func override(name, engine, choice, nodeName string, sel map[string]string) *unstructured.Unstructured {
	spec := map[string]any{"engine": engine, "choice": choice}
	if nodeName != "" {
		spec["nodeName"] = nodeName
	}
	if sel != nil {
		ml := map[string]any{}
		for k, v := range sel {
			ml[k] = v
		}
		spec["nodeSelector"] = map[string]any{"matchLabels": ml}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpupin.io/v1alpha1", "kind": "EngineOverride",
		"metadata": map[string]any{"name": name}, "spec": spec}}
}

func mkNode(t *testing.T, kube kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	_, err := kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// The schema refuses what the API server can judge: nodeName with a
// selector, a YAML boolean where a choice goes, a bad engine name.
func TestEngineOverrideSchema(t *testing.T) {
	needCluster(t)
	dyn, _ := clients(t, cluster.Admin())
	r := dyn.Resource(fleet.EngineOverrides)
	ctx := context.Background()
	boolChoice := override("bool-choice", "vllm", "x", "", nil)
	unstructured.SetNestedField(boolChoice.Object, false, "spec", "choice")
	cases := []struct {
		name string
		obj  *unstructured.Unstructured
		want string // "" = accepted
	}{
		{"good", override("schema-good", "vllm", "cu129", "", map[string]string{"nvidia.com/gpu.product": "NVIDIA-A10"}), ""},
		{"both", override("schema-both", "vllm", "cu129", "n1", map[string]string{"a": "b"}), "not both"},
		{"yaml boolean", boolChoice, "spec.choice"},
		{"engine name", override("schema-engine", "VLLM!", "cu13", "", nil), "spec.engine"},
		{"space in choice", override("schema-space", "vllm", "cu 13", "", nil), "no spaces"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.Create(ctx, c.obj, metav1.CreateOptions{})
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				r.Delete(ctx, c.obj.GetName(), metav1.DeleteOptions{})
				return
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want Invalid mentioning %q, got %v", c.want, err)
			}
		})
	}
}

// statusObj is a GPUPinNode named name with a status.
func statusObj(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpupin.io/v1alpha1", "kind": "GPUPinNode", "metadata": map[string]any{"name": name},
		"status": map[string]any{"driver": "580.65.06", "ready": "0/0"}}}
}

// podToken is a service-account token of gpupin-agent bound to a pod on
// nodeName, as kubelet mounts one into the DaemonSet's pod there.
func podToken(t *testing.T, kube kubernetes.Interface, nodeName string) string {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + nodeName, Namespace: "gpupin-system"},
		Spec: corev1.PodSpec{NodeName: nodeName, ServiceAccountName: "gpupin-agent", AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: "ghcr.io/gpupin/gpupin:0.1.0"}}}}
	p, err := kube.CoreV1().Pods("gpupin-system").Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		p, err = kube.CoreV1().Pods("gpupin-system").Get(ctx, pod.Name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts("gpupin-system").CreateToken(ctx, "gpupin-agent", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// Agent A's credentials write node A's GPUPinNode and no other: as a
// DaemonSet pod's bound token and as a per-node user. Neither may touch
// an EngineOverride.
func TestAgentWritesOnlyItsOwnNode(t *testing.T) {
	needCluster(t)
	_, admin := clients(t, cluster.Admin())
	mkNode(t, admin, "node-a", nil)
	mkNode(t, admin, "node-b", nil)
	for _, who := range []struct{ name, token string }{
		{"pod-bound service account", podToken(t, admin, "node-a")},
		{"per-node user", "gpupin:agent:node-a"},
	} {
		t.Run(who.name, func(t *testing.T) {
			dyn, _ := clients(t, cluster.Config(who.token))
			ctx := context.Background()
			r := dyn.Resource(fleet.GPUPinNodes)
			admDyn, _ := clients(t, cluster.Admin())
			for _, n := range []string{"node-a", "node-b"} {
				admDyn.Resource(fleet.GPUPinNodes).Delete(ctx, n, metav1.DeleteOptions{})
			}
			// Its own: create, then the status.
			own, err := r.Create(ctx, statusObj("node-a"), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("own node's object: %v", err)
			}
			own.Object["status"] = statusObj("node-a").Object["status"]
			if _, err := r.UpdateStatus(ctx, own, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("own node's status: %v", err)
			}
			// Another's: neither create nor status.
			if _, err := r.Create(ctx, statusObj("node-b"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
				!strings.Contains(err.Error(), "only its own node") {
				t.Fatalf("creating node-b's object: want Forbidden by the policy, got %v", err)
			}
			other, err := admDyn.Resource(fleet.GPUPinNodes).Create(ctx, statusObj("node-b"), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			other.Object["status"] = map[string]any{"driver": "forged"}
			if _, err := r.UpdateStatus(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("writing node-b's status: want Forbidden, got %v", err)
			}
			if err := r.Delete(ctx, "node-a", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("deleting a GPUPinNode: want Forbidden (RBAC), got %v", err)
			}
			if _, err := dyn.Resource(fleet.EngineOverrides).Create(ctx, override("by-agent", "vllm", "none", "", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
				t.Fatalf("an agent creating an EngineOverride: want Forbidden, got %v", err)
			}
			if _, err := dyn.Resource(fleet.EngineOverrides).List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatalf("an agent reading the overrides: %v", err)
			}
		})
	}
}

// fakeAgent stands in for agent.Agent (the API server is real): it
// records the cluster overrides it is handed.
type fakeAgent struct {
	mu      sync.Mutex
	wants   []provision.Want
	ov      map[string]string
	changed chan map[string]string
	sts     []provision.Status
}

func newFakeAgent() *fakeAgent { return &fakeAgent{changed: make(chan map[string]string, 100)} }

func (f *fakeAgent) SetClusterOverrides(m map[string]string) error {
	f.mu.Lock()
	f.ov = maps.Clone(m)
	f.mu.Unlock()
	f.changed <- maps.Clone(m)
	return nil
}
func (f *fakeAgent) SetWants(w []provision.Want) error {
	f.mu.Lock()
	f.wants = w
	f.mu.Unlock()
	return nil
}

func (f *fakeAgent) refs() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var r []string
	for _, w := range f.wants {
		r = append(r, w.Ref)
	}
	return strings.Join(r, ",")
}

func (f *fakeAgent) get(engine string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ov[engine]
}
func (f *fakeAgent) FileOverrides() map[string]string { return map[string]string{"sglang": "none"} }
func (f *fakeAgent) Status() []provision.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]provision.Status(nil), f.sts...)
}

// await waits for the agent to be handed overrides where engine is want
// ("" = absent), and returns how long it took.
func (f *fakeAgent) await(t *testing.T, engine, want string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(limit)
	for {
		f.mu.Lock()
		got, ok := f.ov[engine]
		f.mu.Unlock()
		if (want == "" && !ok) || (ok && got == want) {
			return time.Since(start)
		}
		select {
		case <-f.changed:
		case <-deadline:
			t.Fatalf("after %s, %s is %q (set %v), want %q", limit, engine, got, ok, want)
		}
	}
}

func startNode(t *testing.T, ctx context.Context, token, name, cache string, a fleet.Agent) *fleet.Node {
	t.Helper()
	return startNodeWants(t, ctx, token, name, cache, "", a)
}

func startNodeWants(t *testing.T, ctx context.Context, token, name, cache, wants string, a fleet.Agent) *fleet.Node {
	t.Helper()
	n, err := fleet.NewNode(fleet.NodeOptions{Config: cluster.Config(token), NodeName: name, CachePath: cache, WantsConfigMap: wants,
		SyncTimeout: 3 * time.Second, Facts: node.Static{Facts: &node.Facts{Driver: "575.57.08", CUDA: "12.9", Simulated: true,
			GPUs: []node.GPU{{Name: "NVIDIA A10", CC: "8.6"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx, a); err != nil {
		t.Fatal(err)
	}
	// The test's deferred cancel runs first: nothing writes into its
	// TempDir once it is being removed.
	t.Cleanup(n.Wait)
	return n
}

// An override's create, change and delete reach the node's agent within
// 2 s each, by precedence: node > group > cluster; deleting one falls
// back to the next level; a bad choice keeps the last good one and says
// so in an Event and the status.
func TestOverridesReachTheAgentByPrecedence(t *testing.T) {
	needCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn, admin := clients(t, cluster.Admin())
	mkNode(t, admin, "node-a", nil)
	eo := dyn.Resource(fleet.EngineOverrides)
	clean := func() {
		for _, n := range []string{"p-cluster", "p-group", "p-node"} {
			eo.Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	}
	clean()
	t.Cleanup(clean)
	a := newFakeAgent()
	n := startNode(t, ctx, "gpupin:agent:node-a", "node-a", filepath.Join(t.TempDir(), "cluster-overrides.json"), a)
	a.await(t, "vllm", "", 2*time.Second)

	step := func(what string, do func() error, want string) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		d := a.await(t, "vllm", want, 2*time.Second)
		t.Logf("%s: vllm=%q after %s", what, want, d.Round(time.Millisecond))
	}
	create := func(o *unstructured.Unstructured) func() error {
		return func() error { _, err := eo.Create(ctx, o, metav1.CreateOptions{}); return err }
	}
	del := func(name string) func() error {
		return func() error { return eo.Delete(ctx, name, metav1.DeleteOptions{}) }
	}
	a10 := map[string]string{"nvidia.com/gpu.product": "NVIDIA-A10"}
	step("cluster-wide cu13", create(override("p-cluster", "vllm", "cu13", "", nil)), "cu13")
	step("group cu129 on a node not yet labelled", create(override("p-group", "vllm", "cu129", "", a10)), "cu13")
	step("node labelled A10", func() error {
		nd, err := admin.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			return err
		}
		nd.Labels = a10
		_, err = admin.CoreV1().Nodes().Update(ctx, nd, metav1.UpdateOptions{})
		return err
	}, "cu129")
	step("node's own none", create(override("p-node", "vllm", "none", "node-a", nil)), "none")
	if got := n.Choices().Sources["vllm"]; got != "EngineOverride p-node (node)" {
		t.Fatalf("source %q", got)
	}
	step("node's deleted: back to the group's", del("p-node"), "cu129")

	// A bad choice at the winning level: the last good one holds.
	bad := override("p-node", "vllm", "cu13@@bad", "node-a", nil)
	if _, err := eo.Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the rejection", func() bool { return len(n.Choices().Rejections) == 1 })
	if got := a.get("vllm"); got != "cu129" {
		t.Fatalf("a bad override moved the choice to %q", got)
	}
	waitFor(t, 5*time.Second, "the OverrideRejected Event on the Node", func() bool {
		evs, err := admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=node-a,involvedObject.uid=node-a,reason=OverrideRejected"})
		return err == nil && len(evs.Items) > 0
	})
	waitFor(t, 5*time.Second, "the rejection in the GPUPinNode status", func() bool {
		g, err := dyn.Resource(fleet.GPUPinNodes).Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			return false
		}
		rej, _, _ := unstructured.NestedSlice(g.Object, "status", "overrideRejections")
		return len(rej) == 1 && strings.Contains(fmt.Sprint(rej[0]), "p-node")
	})
	step("bad one deleted", del("p-node"), "cu129")
	step("group's deleted: back to the cluster's", del("p-group"), "cu13")
	step("cluster's deleted: the node's file decides", del("p-cluster"), "")
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The node's GPUPinNode carries each engine's state, variant, digest,
// proof time, override source and last failure, and the Node gets an
// Event per state change.
func TestStatusAndEventsSimulated(t *testing.T) {
	needCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn, admin := clients(t, cluster.Admin())
	mkNode(t, admin, "node-b", nil)
	admDyn := dyn.Resource(fleet.GPUPinNodes)
	admDyn.Delete(ctx, "node-b", metav1.DeleteOptions{})
	a := newFakeAgent()
	n := startNode(t, ctx, "gpupin:agent:node-b", "node-b", "", a)
	now := time.Now()
	ready := provision.Status{Key: "vllm:0.11.0", Engine: "vllm", Version: "0.11.0", State: provision.Ready, Override: "auto",
		Variant: "cu129", Pinned: "reg.example/vllm@sha256:" + strings.Repeat("a", 64), Simulated: true, At: now,
		Pin:      &containerd.Pin{ProbedAt: now},
		Rejected: []images.Rejection{{Variant: "cu13", Reason: "driver 575.57 supports CUDA 12.9; cu13 needs 13.0"}}}
	failed := provision.Status{Key: "sglang:0.5.0", Engine: "sglang", Version: "0.5.0", State: provision.Failed, Override: "none",
		Attempted: "cu129", Detail: "probe failed: no GPUPIN-PROBE line", Simulated: true, At: now, Err: provision.ErrAllFailed,
		Attempts: []provision.Attempt{{Variant: "cu129", Stage: "probe", Reason: "no GPUPIN-PROBE line"}}}
	a.mu.Lock()
	a.sts = []provision.Status{ready, failed}
	a.mu.Unlock()
	n.StatusChanged(ready)
	n.StatusChanged(failed)
	var got fleet.GPUPinNode
	waitFor(t, 5*time.Second, "node-b's status with both engines", func() bool {
		u, err := admDyn.Get(ctx, "node-b", metav1.GetOptions{})
		if err != nil {
			return false
		}
		got = fleet.GPUPinNode{}
		if err := runtimeconv.DefaultUnstructuredConverter.FromUnstructured(u.Object, &got); err != nil {
			t.Fatal(err)
		}
		return len(got.Status.Engines) == 2
	})
	s := got.Status
	if s.Driver != "575.57.08" || s.CUDA != "12.9" || !s.Simulated || len(s.GPUs) != 1 || s.GPUs[0] != "NVIDIA A10" || s.Ready != "1/2" {
		t.Fatalf("node facts: %+v", s)
	}
	if !strings.Contains(s.Summary, "vllm:0.11.0=ready/cu129") || !strings.Contains(s.Summary, "sglang:0.5.0=failed") {
		t.Fatalf("summary %q", s.Summary)
	}
	byKey := map[string]fleet.EngineStatus{}
	for _, e := range s.Engines {
		byKey[e.Key] = e
	}
	v, sg := byKey["vllm:0.11.0"], byKey["sglang:0.5.0"]
	if v.Variant != "cu129" || v.Pinned != ready.Pinned || v.ProvedAt == nil || len(v.Rejections) != 1 || v.OverrideSource != "default" {
		t.Fatalf("vllm: %+v", v)
	}
	if sg.LastFailure == nil || sg.LastFailure.Reason != "ProbeFailed" || sg.OverrideSource != "the node's overrides file" {
		t.Fatalf("sglang: %+v (failure %+v)", sg, sg.LastFailure)
	}
	for _, reason := range []string{"EngineReady", "EngineProbeFailed"} {
		waitFor(t, 5*time.Second, reason+" Event on node-b", func() bool {
			evs, err := admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=node-b,involvedObject.uid=node-b,reason=" + reason})
			return err == nil && len(evs.Items) == 1
		})
	}
}

// An API outage changes nothing on the node: the running agent keeps its
// choices, an agent restarted meanwhile gets them from the node's cache
// file before its first provision, and both catch up once the API is back.
func TestOutageKeepsChoicesAndCatchesUp(t *testing.T) {
	needCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn, admin := clients(t, cluster.Admin())
	mkNode(t, admin, "node-a", nil)
	eo := dyn.Resource(fleet.EngineOverrides)
	eo.Delete(ctx, "outage", metav1.DeleteOptions{})
	t.Cleanup(func() { eo.Delete(context.Background(), "outage", metav1.DeleteOptions{}) })
	cache := filepath.Join(t.TempDir(), "cluster-overrides.json")
	a := newFakeAgent()
	startNode(t, ctx, "gpupin:agent:node-a", "node-a", cache, a)
	if _, err := eo.Create(ctx, override("outage", "vllm", "cu129", "", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.await(t, "vllm", "cu129", 2*time.Second)

	cluster.StopAPIServer()
	restarted := false
	defer func() {
		if !restarted {
			cluster.StartAPIServer()
		}
	}()
	time.Sleep(2 * time.Second)
	if got := a.get("vllm"); got != "cu129" {
		t.Fatalf("during the outage the choice became %q", got)
	}
	// A restarted agent: the API does not answer within SyncTimeout.
	b := newFakeAgent()
	startNode(t, ctx, "gpupin:agent:node-a", "node-a", cache, b)
	if got := b.get("vllm"); got != "cu129" {
		t.Fatalf("an agent started during the outage has %q, want the cached cu129", got)
	}

	if err := cluster.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	back := time.Now()
	u, err := eo.Get(ctx, "outage", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructured.SetNestedField(u.Object, "cu13", "spec", "choice")
	if _, err := eo.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The informers' reconnect backs off up to 30 s with a jitter of 1.0
	// (client-go's reflector: 800 ms doubling, capped at 30 s), so up to
	// 60 s; an API server that just came back may also refuse a first
	// watch as forbidden, its authorizer not yet synced, which backs off
	// again. 45 s was seen to miss once on 2 busy cores.
	a.await(t, "vllm", "cu13", 90*time.Second)
	b.await(t, "vllm", "cu13", 90*time.Second)
	t.Logf("both agents caught up %s after the API server was back", time.Since(back).Round(time.Millisecond))
	eo.Delete(ctx, "outage", metav1.DeleteOptions{})
}

// The wants read through the API from the agent's ConfigMap (only that
// one: RBAC's resourceNames with a field-selected watch): applied within
// 2 s of an edit; a bad edit changes nothing and is an Event on the Node.
func TestWantsFromTheConfigMap(t *testing.T) {
	needCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, admin := clients(t, cluster.Admin())
	mkNode(t, admin, "node-a", nil)
	cms := admin.CoreV1().ConfigMaps("gpupin-system")
	cms.Delete(ctx, "gpupin-agent", metav1.DeleteOptions{})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpupin-agent", Namespace: "gpupin-system"},
		Data: map[string]string{fleet.WantsKey: "wants:\n  - ref: reg.example/org/vllm:0.11.0\n"}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := newFakeAgent()
	startNodeWants(t, ctx, "gpupin:agent:node-a", "node-a", "", "gpupin-system/gpupin-agent", a)
	if got := a.refs(); got != "reg.example/org/vllm:0.11.0" {
		t.Fatalf("wants at start: %q", got)
	}
	edit := func(data string) time.Time {
		t.Helper()
		cm.Data[fleet.WantsKey] = data
		start := time.Now()
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return start
	}
	start := edit("wants:\n  - ref: reg.example/org/vllm:0.11.0\n  - ref: reg.example/org/sglang:0.5.0\n")
	waitFor(t, 2*time.Second, "the second want", func() bool { return strings.Count(a.refs(), ",") == 1 })
	t.Logf("an edit of the ConfigMap reached the agent in %s", time.Since(start).Round(time.Millisecond))
	edit("wantz: []\n")
	waitFor(t, 5*time.Second, "the WantsRejected Event", func() bool {
		evs, err := admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=node-a,reason=WantsRejected"})
		return err == nil && len(evs.Items) > 0
	})
	if strings.Count(a.refs(), ",") != 1 {
		t.Fatalf("a bad ConfigMap changed the wants to %q", a.refs())
	}
	// Another ConfigMap in the namespace is not the agent's to read.
	if _, err := kubernetes.NewForConfigOrDie(cluster.Config("gpupin:agent:node-a")).CoreV1().ConfigMaps("gpupin-system").Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("reading another ConfigMap: want Forbidden, got %v", err)
	}
}
