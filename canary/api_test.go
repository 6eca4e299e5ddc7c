package canary_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/canary"
	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/provision"
)

// The canary against a real kube-apiserver, as the agents use it: each
// simulated node is the user gpupin:agent:NODE of group gpupin:agents,
// with the RBAC and own-node policy of deploy/kubernetes/fleet-rbac.yaml;
// the canary's verdict is its GPUPinNode status, written by fleet's
// StatusWriter from a provision.Status, as the agent writes it.

const ns = "gpupin-system"

var manifests = []string{"../deploy/kubernetes/fleet-crds.yaml", "../deploy/kubernetes/fleet-rbac.yaml"}

const class = "NVIDIA H100 80GB HBM3 driver 580 simulated"

func users() []kubetest.User {
	var us []kubetest.User
	for i := range 8 {
		us = append(us, kubetest.User{Name: "gpupin:agent:n" + strconv.Itoa(i), Groups: []string{"gpupin:agents"}})
	}
	return us
}

type nodeClients struct {
	kube *kubernetes.Clientset
	dyn  dynamic.Interface
}

func clients(t *testing.T, c *kubetest.Cluster, node string) nodeClients {
	t.Helper()
	cfg := c.Config("gpupin:agent:" + node)
	cfg.Timeout = 10 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return nodeClients{kube, dyn}
}

func gate(t *testing.T, c *kubetest.Cluster, node string, opts ...canary.Option) *canary.Gate {
	t.Helper()
	cl := clients(t, c, node)
	g, err := canary.New(cl.kube.CoordinationV1(), cl.dyn, ns, node, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// publish writes node's GPUPinNode status for st through fleet's status
// writer, and returns once it is written.
func publish(t *testing.T, c *kubetest.Cluster, node string, st provision.Status) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &fleet.StatusWriter{Dyn: clients(t, c, node).dyn, NodeName: node, Every: time.Hour,
		Build: func(context.Context) fleet.NodeStatus {
			return fleet.BuildStatus([]provision.Status{st}, nil, fleet.Choices{}, nil, map[string]*fleet.Failure{})
		}}
	go w.Run(ctx)
	w.Kick()
	deadline := time.Now().Add(20 * time.Second)
	for w.Writes() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: status never written", node)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type result struct {
	node  string
	v     provision.CanaryVerdict
	done  func()
	err   error
	notes []string
	at    time.Time
}

func await(g *canary.Gate, ctx context.Context, node, class, key string) result {
	r := result{node: node}
	var mu sync.Mutex
	r.v, r.done, r.err = g.Await(ctx, class, key, func(c string) { mu.Lock(); r.notes = append(r.notes, c); mu.Unlock() })
	r.at = time.Now()
	return r
}

// TestClassWaitsOnItsCanary: four nodes of one class want a version at
// once. One is the canary; the others wait on it, named in their note,
// and take its verdict (cu13's probe failed, cu129 passed) once its
// status shows it. A node of another class does not wait; one that comes
// later takes the verdict at once.
func TestClassWaitsOnItsCanary(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	key := "vllm:0.12.0"
	results := make(chan result, 4)
	for i := range 4 {
		node := "n" + strconv.Itoa(i)
		g := gate(t, c, node, canary.WithLeaseDuration(3*time.Second))
		go func() { results <- await(g, context.Background(), node, class, key) }()
	}
	var lead result
	var waiters []result
	timeout := time.After(30 * time.Second)
	for len(waiters)+btoi(lead.node != "") < 4 {
		var r result
		select {
		case r = <-results:
		case <-timeout:
			t.Fatalf("waiting for the canary: lead %q, %d waiters back", lead.node, len(waiters))
		}
		if r.err != nil {
			t.Fatalf("%s: %v", r.node, r.err)
		}
		if r.done != nil {
			if lead.node != "" {
				t.Fatalf("two canaries: %s and %s", lead.node, r.node)
			}
			lead = r
			// Another class asks meanwhile: it has a canary of its own,
			// itself, at once.
			other := await(gate(t, c, "n6"), context.Background(), "n6", "NVIDIA A100-SXM4-80GB driver 580 simulated", key)
			if other.err != nil || other.done == nil {
				t.Fatalf("another class waited on this one's canary: %+v", other)
			}
			go other.done() // n6 publishes no status: its lease is released after the status wait
			// The canary proves: cu13's probe fails, cu129 passes.
			time.Sleep(time.Second)
			publish(t, c, lead.node, provision.Status{Key: key, Engine: "vllm", Version: "0.12.0", State: provision.Ready,
				Variant: "cu129", Pinned: "registry.test/vllm@sha256:" + strings.Repeat("b", 64), At: time.Now(),
				Attempts: []provision.Attempt{{Variant: "cu13", Stage: "probe", Reason: "probe exited 1: no kernel image is available"}}})
			lead.done()
			continue
		}
		waiters = append(waiters, r)
	}
	if len(waiters) != 3 {
		t.Fatalf("%d waiters, want 3", len(waiters))
	}
	for _, w := range waiters {
		if w.v.Node != lead.node || w.v.Passed != "cu129" || !strings.Contains(w.v.Failed["cu13"], "no kernel image") {
			t.Errorf("%s: verdict %+v, want canary %s's: cu129 passed, cu13 failed", w.node, w.v, lead.node)
		}
		if len(w.notes) == 0 || w.notes[0] != lead.node {
			t.Errorf("%s: notes %q, want the canary %s named", w.node, w.notes, lead.node)
		}
	}
	late := await(gate(t, c, "n5"), context.Background(), "n5", class, key)
	if late.err != nil || late.done != nil || late.v.Node != lead.node || late.v.Passed != "cu129" {
		t.Fatalf("a later node: %+v, want canary %s's verdict at once", late, lead.node)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDeadCanaryReplaced: a canary whose provision ends without a verdict
// (the node died: no renewal, no done) loses its lease within the lease
// duration; a waiter takes it and is the canary.
func TestDeadCanaryReplaced(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	key := "vllm:0.13.0"
	ctx0, kill := context.WithCancel(context.Background())
	first := await(gate(t, c, "n0", canary.WithLeaseDuration(3*time.Second)), ctx0, "n0", class, key)
	if first.err != nil || first.done == nil {
		t.Fatalf("n0: %+v, want the canary", first)
	}
	next := make(chan result, 1)
	go func() {
		next <- await(gate(t, c, "n1", canary.WithLeaseDuration(3*time.Second)), context.Background(), "n1", class, key)
	}()
	time.Sleep(2 * time.Second)
	killed := time.Now()
	kill()
	var r result
	select {
	case r = <-next:
	case <-time.After(30 * time.Second):
		t.Fatal("n1 still waits on a dead canary")
	}
	if r.err != nil || r.done == nil || r.v.Node != "" {
		t.Fatalf("n1: %+v, want it the canary now", r)
	}
	if len(r.notes) == 0 || r.notes[0] != "n0" {
		t.Errorf("n1 notes %q, want n0 named while it lived", r.notes)
	}
	l, err := clients(t, c, "n1").kube.CoordinationV1().Leases(ns).Get(context.Background(), canary.LeaseName(class, key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity != "n1" || l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions != 1 {
		t.Errorf("lease holder %s, transitions %v; want n1, 1", *l.Spec.HolderIdentity, l.Spec.LeaseTransitions)
	}
	t.Logf("n1 became the canary %s after n0 died", r.at.Sub(killed).Round(100*time.Millisecond))
}

// TestCanaryBounds: a canary that hangs (renews, never done) holds the
// class at most its max wait; one whose verdict never reaches its status
// releases the lease, and the next node proves.
func TestCanaryBounds(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	t.Run("hangs", func(t *testing.T) {
		key := "vllm:0.14.0"
		lead := await(gate(t, c, "n0", canary.WithLeaseDuration(3*time.Second)), context.Background(), "n0", class, key)
		if lead.done == nil {
			t.Fatalf("n0: %+v, want the canary", lead)
		}
		start := time.Now()
		r := await(gate(t, c, "n1", canary.WithLeaseDuration(3*time.Second), canary.WithMaxWait(5*time.Second)), context.Background(), "n1", class, key)
		if r.err != nil || r.done != nil || r.v.Node != "" || !strings.Contains(r.v.Reason, "no verdict from canary n0 within 5s") {
			t.Fatalf("n1: %+v, want no verdict, bounded", r)
		}
		if waited := r.at.Sub(start); waited < 5*time.Second {
			t.Errorf("n1 gave up after %s, before its max wait", waited)
		}
	})
	t.Run("no status", func(t *testing.T) {
		key := "vllm:0.15.0"
		lead := await(gate(t, c, "n2", canary.WithStatusWait(2*time.Second)), context.Background(), "n2", class, key)
		if lead.done == nil {
			t.Fatalf("n2: %+v, want the canary", lead)
		}
		next := make(chan result, 1)
		go func() { next <- await(gate(t, c, "n3"), context.Background(), "n3", class, key) }()
		time.Sleep(time.Second)
		lead.done() // no status shows the outcome: released after 2 s
		var r result
		select {
		case r = <-next:
		case <-time.After(20 * time.Second):
			t.Fatal("n3 still waits on a released lease")
		}
		if r.err != nil || r.done == nil {
			t.Fatalf("n3: %+v, want it the canary", r)
		}
	})
}
