package fleet_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeconv "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// A node's GPUPinNode carries Ready and Degraded as metav1.Conditions
// that the real kubectl understands: `kubectl wait --for=condition=Ready`
// times out while an engine is probing and returns once it is pinned,
// `kubectl get gpupinnodes` shows the Ready column, a rewrite without a
// change keeps lastTransitionTime, every condition carries the object's
// generation, and a failed probe makes Degraded True with the engine,
// variant and error.
func TestReadyConditionForKubectlWaitSimulated(t *testing.T) {
	needCluster(t)
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("no kubectl on PATH (scripts/deps.sh test installs it): %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name = "cond-a"
	dyn, admin := clients(t, cluster.Admin())
	mkNode(t, admin, name, nil)
	gpn := dyn.Resource(fleet.GPUPinNodes)
	gpn.Delete(ctx, name, metav1.DeleteOptions{})
	kc, err := cluster.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	run := func(timeout time.Duration, args ...string) (string, error) {
		c, stop := context.WithTimeout(ctx, timeout)
		defer stop()
		out, err := exec.CommandContext(c, kubectl, append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
		return string(out), err
	}

	now := time.Now()
	base := provision.Status{Key: "vllm:0.11.0", Engine: "vllm", Version: "0.11.0", Override: "auto", Simulated: true, At: now}
	probing := base
	probing.State, probing.Attempted, probing.Detail = provision.Probing, "cu13", "probing reg.example/vllm:0.11.0-cu13"
	a := newFakeAgent()
	a.sts = []provision.Status{probing}
	n, err := fleet.NewNode(fleet.NodeOptions{Config: cluster.Config("gpupin:agent:" + name), NodeName: name,
		SyncTimeout: 3 * time.Second, StatusEvery: 200 * time.Millisecond,
		Facts: node.Static{Facts: &node.Facts{Driver: "580.82.07", CUDA: "13.0", Simulated: true,
			GPUs: []node.GPU{{Name: "NVIDIA H100", CC: "9.0"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx, a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Wait)
	set := func(st provision.Status) {
		a.mu.Lock()
		a.sts = []provision.Status{st}
		a.mu.Unlock()
		n.StatusChanged(st)
	}

	// Probing: Ready False, Provisioning; the wait times out.
	c := awaitCondition(t, gpn, name, fleet.ConditionReady, "False", fleet.ReasonProvisioning)
	if !strings.Contains(c.Message, "vllm:0.11.0 probing cu13") {
		t.Errorf("Ready's message %q does not say what is under way", c.Message)
	}
	if out, err := run(30*time.Second, "wait", "--for=condition=Ready", "gpupinnode/"+name, "--timeout=2s"); err == nil {
		t.Fatalf("kubectl wait returned while the engine was probing:\n%s", out)
	} else if !strings.Contains(out, "timed out") {
		t.Fatalf("kubectl wait: %v, want a timeout:\n%s", err, out)
	}

	// A kubectl wait under way returns once the engine is pinned.
	var waitOut bytes.Buffer
	wait := exec.CommandContext(ctx, kubectl, "--kubeconfig", kc, "wait", "--for=condition=Ready", "gpupinnode/"+name, "--timeout=60s")
	wait.Stdout, wait.Stderr = &waitOut, &waitOut
	if err := wait.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // it is watching by now
	ready := base
	ready.State, ready.Variant, ready.Attempted = provision.Ready, "cu13", "cu13"
	ready.Pinned = "reg.example/vllm@sha256:" + strings.Repeat("b", 64)
	ready.Pin = &containerd.Pin{ProbedAt: now}
	set(ready)
	start := time.Now()
	if err := wait.Wait(); err != nil {
		t.Fatalf("kubectl wait --for=condition=Ready: %v\n%s", err, waitOut.String())
	}
	if !strings.Contains(waitOut.String(), "gpupinnode.gpupin.io/"+name+" condition met") {
		t.Errorf("kubectl wait said:\n%s", waitOut.String())
	}
	t.Logf("kubectl wait returned %s after the engine was pinned", time.Since(start).Round(time.Millisecond))

	// kubectl get: the Ready column from the condition, beside the count.
	out, err := run(30*time.Second, "get", "gpupinnodes", name)
	if err != nil {
		t.Fatalf("kubectl get gpupinnodes: %v\n%s", err, out)
	}
	t.Logf("kubectl get gpupinnodes:\n%s", out)
	if got := column(t, out, "READY"); got != "True" {
		t.Errorf("READY column %q, want True", got)
	}
	if got := column(t, out, "READY/WANTED"); got != "1/1" {
		t.Errorf("READY/WANTED column %q, want 1/1", got)
	}
	if got := column(t, out, "DRIVER"); got != "580.82.07" {
		t.Errorf("DRIVER column %q", got)
	}
	out, err = run(30*time.Second, "get", "gpn", name, "-o", "wide")
	if err != nil {
		t.Fatalf("kubectl get gpn -o wide: %v\n%s", err, out)
	}
	if got := column(t, out, "DEGRADED"); got != "False" {
		t.Errorf("DEGRADED column %q, want False:\n%s", got, out)
	}

	// Rewrites without a change keep lastTransitionTime (second
	// precision: wait past a second) and carry the generation.
	c = awaitCondition(t, gpn, name, fleet.ConditionReady, "True", fleet.ReasonEnginesReady)
	since, writes := c.LastTransitionTime, n.StatusWrites()
	time.Sleep(1500 * time.Millisecond)
	if w := n.StatusWrites(); w < writes+3 {
		t.Fatalf("%d status writes in 1.5 s at one per 200 ms", w-writes)
	}
	c = awaitCondition(t, gpn, name, fleet.ConditionReady, "True", fleet.ReasonEnginesReady)
	if !c.LastTransitionTime.Equal(&since) {
		t.Errorf("Ready's lastTransitionTime moved from %s to %s without a change", since, c.LastTransitionTime)
	}

	// A new generation (an admin gives the object a spec) is observed on the
	// agent's next write.
	u, err := gpn.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gen := u.GetGeneration()
	if gen < 2 {
		t.Fatalf("an edit of spec left metadata.generation at %d", gen)
	}
	waitFor(t, 5*time.Second, "both conditions at the new generation", func() bool {
		u, err := gpn.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		g := decode(t, u.Object)
		return len(g.Status.Conditions) == 2 && g.Status.Conditions[0].ObservedGeneration == gen &&
			g.Status.Conditions[1].ObservedGeneration == gen
	})

	// A failed probe with nothing to fall back on: Ready False, and
	// Degraded True saying which engine, variant and why.
	failed := base
	failed.State, failed.Attempted, failed.Err = provision.Failed, "cu13", provision.ErrAllFailed
	failed.Detail = "probe failed: GPU 0 max_abs_err 0.5 over 0.01"
	failed.Attempts = []provision.Attempt{{Variant: "cu13", Stage: "probe", Reason: failed.Detail}}
	set(failed)
	d := awaitCondition(t, gpn, name, fleet.ConditionDegraded, "True", "ProbeFailed")
	for _, w := range []string{"vllm:0.11.0", "ProbeFailed on cu13", "max_abs_err 0.5 over 0.01", "SIMULATED"} {
		if !strings.Contains(d.Message, w) {
			t.Errorf("Degraded's message %q lacks %q", d.Message, w)
		}
	}
	c = awaitCondition(t, gpn, name, fleet.ConditionReady, "False", fleet.ReasonEngineFailed)
	if !c.LastTransitionTime.After(since.Time) {
		t.Errorf("Ready went False, lastTransitionTime %s not after %s", c.LastTransitionTime, since)
	}
	for _, cond := range []string{"--for=condition=Degraded", "--for=condition=Ready=false"} {
		if out, err := run(30*time.Second, "wait", cond, "gpupinnode/"+name, "--timeout=10s"); err != nil {
			t.Errorf("kubectl wait %s: %v\n%s", cond, err, out)
		}
	}
	out, err = run(30*time.Second, "describe", "gpupinnode", name)
	if err != nil || !strings.Contains(out, "ProbeFailed") {
		t.Errorf("kubectl describe: %v\n%s", err, out)
	}
}

func decode(t *testing.T, obj map[string]any) fleet.GPUPinNode {
	t.Helper()
	var g fleet.GPUPinNode
	if err := runtimeconv.DefaultUnstructuredConverter.FromUnstructured(obj, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// awaitCondition waits for name's condition typ to have status and
// reason, and checks that its observedGeneration is the object's.
func awaitCondition(t *testing.T, gpn dynamic.NamespaceableResourceInterface, name, typ, status, reason string) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	var last *fleet.GPUPinNode
	deadline := time.Now().Add(10 * time.Second)
	for {
		if u, err := gpn.Get(context.Background(), name, metav1.GetOptions{}); err == nil {
			g := decode(t, u.Object)
			last = &g
			if c := meta.FindStatusCondition(g.Status.Conditions, typ); c != nil && string(c.Status) == status && c.Reason == reason {
				got = *c
				if c.ObservedGeneration != g.Generation || g.Generation < 1 {
					t.Errorf("%s observedGeneration %d, metadata.generation %d", typ, c.ObservedGeneration, g.Generation)
				}
				if c.LastTransitionTime.IsZero() || c.Message == "" {
					t.Errorf("%s without lastTransitionTime or message: %+v", typ, c)
				}
				return got
			}
		}
		if time.Now().After(deadline) {
			if last != nil {
				t.Fatalf("no %s=%s (%s) on %s after 10 s; conditions %+v", typ, status, reason, name, last.Status.Conditions)
			}
			t.Fatalf("no GPUPinNode %s after 10 s", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// column is the first row's value in the column headed head of kubectl's
// table (columns start where their headers do: a value may hold spaces).
func column(t *testing.T, table, head string) string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("no rows in:\n%s", table)
	}
	hdr := lines[0] + " "
	at := strings.Index(hdr, " "+head+" ")
	if at < 0 {
		t.Fatalf("no column %s in:\n%s", head, table)
	}
	at++
	row := lines[1]
	if len(row) <= at {
		return ""
	}
	f := strings.Fields(row[at:])
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
