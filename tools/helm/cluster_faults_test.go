//go:build cluster

package helm_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/sandbox"
)

// checkBadSocket upgrades the release to a containerd socket that is not
// there: the rolled agent exits with one line that names it, kubelet backs
// off restarting it (CrashLoopBackOff), and no pin changes. The release is
// left on the bad value; the caller upgrades it back.
func checkBadSocket(t *testing.T, c *kubetest.Cluster, h *helmClient, values map[string]any, n *simNode, key, pinned string) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(c.Admin())
	const bad = "/run/containerd/absent.sock"
	values["containerd"] = map[string]any{"socket": bad}
	h.upgrade(t, values)
	var crashed corev1.Pod
	waitFor(t, 2*time.Minute, "an agent in CrashLoopBackOff", func() (bool, string) {
		pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=gpupin-agent"})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			for _, s := range p.Status.ContainerStatuses {
				if s.State.Waiting != nil && s.State.Waiting.Reason == "CrashLoopBackOff" && s.RestartCount > 0 {
					crashed = p
					return true, ""
				}
			}
		}
		return false, podProblems(cs, namespace)
	})
	st := crashed.Status.ContainerStatuses[0]
	if st.LastTerminationState.Terminated == nil || st.LastTerminationState.Terminated.ExitCode == 0 {
		t.Fatalf("%s: last state %+v: want a non-zero exit", crashed.Name, st.LastTerminationState)
	}
	logs := kubectl(t, c, "logs", "-n", namespace, crashed.Name, "--previous")
	line := "containerd socket " + bad + ": no such file or directory (is containerd running, and at that address?)"
	if !strings.Contains(logs, line) {
		t.Fatalf("%s's log does not say %q:\n%s", crashed.Name, line, logs)
	}
	// One clear line, not a page: what a user reads in kubectl logs.
	if lines := strings.Count(strings.TrimSpace(logs), "\n") + 1; lines > 3 {
		t.Errorf("%s logged %d lines for a missing socket:\n%s", crashed.Name, lines, logs)
	}
	t.Logf("%s on %s: CrashLoopBackOff after %d restarts (exit %d): %s", crashed.Name, crashed.Spec.NodeName,
		st.RestartCount, st.LastTerminationState.Terminated.ExitCode, strings.TrimSpace(logs))
	if p, err := n.rt.GetPin(ctx, key); err != nil || p == nil || p.Ref != pinned {
		t.Fatalf("with a bad socket the pin is %+v (%v), was %s", p, err, pinned)
	}
}

// checkKilledMidProbe adds a want whose first candidate's probe hangs and
// SIGKILLs the agent (an OOM kill, a node drain) while that probe runs.
// Its successor, the container kubelet restarts, removes the probe
// container, its task, snapshot and lease that the dead agent left, times
// the hanging probe out, and pins the next candidate; the earlier pin is
// untouched.
func checkKilledMidProbe(t *testing.T, c *kubetest.Cluster, h *helmClient, dyn dynamic.Interface, values map[string]any, n *simNode, regHost, pinnedKey, pinned string) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(c.Admin())
	const version = "0.12.0"
	archs := "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"
	if _, err := sandbox.PublishEngine(ctx, regHost, engine, version, []sandbox.EngineVariant{
		{Name: "cu13", CUDA: "13.0", Archs: archs, SimProbe: "hang"},
		{Name: "cu129", CUDA: "12.9", Archs: archs},
	}); err != nil {
		t.Fatal(err)
	}
	key := engine + ":" + version
	values["wants"] = append(values["wants"].([]any), map[string]any{
		"engine": engine, "version": version, "ref": fmt.Sprintf("%s/%s:%s", regHost, engine, version)})
	// Long enough that the kill lands mid-probe, short enough that the
	// successor's own run of the hanging probe ends within the test.
	values["extraArgs"] = []any{"--probe-timeout=20s"}
	h.upgrade(t, values)

	waitEngine(t, dyn, n.name, key, func(e fleet.EngineStatus) bool { return e.State == "probing" && e.Attempted == "cu13" })
	ctx = namespaces.WithNamespace(ctx, "k8s.io")
	var owner string
	waitFor(t, time.Minute, "the cu13 probe container", func() (bool, string) {
		owner = ""
		for _, l := range gpupinLeftovers(t, ctx, n) {
			if l.kind == "container" && l.role == "probe" {
				owner = l.owner
			}
		}
		return owner != "", "no probe container yet"
	})
	pid, err := strconv.Atoi(strings.SplitN(owner, ":", 2)[0])
	if err != nil || pid <= 1 {
		t.Fatalf("the probe's owner label %q names no pid", owner)
	}
	restarts := agentRestarts(t, cs, n.name)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent (pid %d): %v", pid, err)
	}
	t.Logf("agent pid %d on %s killed mid-probe", pid, n.name)
	waitFor(t, time.Minute, "the agent's successor", func() (bool, string) {
		r := agentRestarts(t, cs, n.name)
		return r > restarts, fmt.Sprintf("restarts %d", r)
	})
	waitFor(t, time.Minute, "the dead agent's probe swept", func() (bool, string) {
		var left []string
		for _, l := range gpupinLeftovers(t, ctx, n) {
			if l.owner == owner {
				left = append(left, l.String())
			}
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
	got := waitEngine(t, dyn, n.name, key, func(e fleet.EngineStatus) bool { return e.Pinned != "" })
	if got.Variant != "cu129" {
		t.Fatalf("%s after the kill: pinned %s (%s): want cu129, cu13's probe hangs", key, got.Variant, got.Pinned)
	}
	t.Logf("%s: the successor pinned %s (%s); %s", n.name, got.Variant, got.Pinned, got.Detail)
	if left := gpupinLeftovers(t, ctx, n); len(left) != 0 {
		t.Errorf("left behind once the successor settled: %v", left)
	}
	if p, err := n.rt.GetPin(ctx, pinnedKey); err != nil || p == nil || p.Ref != pinned {
		t.Fatalf("after the kill the pin of %s is %+v (%v), was %s", pinnedKey, p, err, pinned)
	}
}

// agentRestarts is the restart count of the agent's container on a node.
func agentRestarts(t *testing.T, cs kubernetes.Interface, nodeName string) int32 {
	t.Helper()
	pods, err := cs.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=gpupin-agent", FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		t.Fatal(err)
	}
	var r int32
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			r += s.RestartCount
		}
	}
	return r
}

// leftover is a transient record gpupin made in a node's containerd.
type leftover struct{ kind, id, role, owner string }

func (l leftover) String() string {
	return fmt.Sprintf("%s %s (%s, owner %s)", l.kind, l.id, l.role, l.owner)
}

// gpupinLeftovers lists the node's gpupin-made containers, their tasks,
// active snapshots and leases, less the leases that hold pins.
func gpupinLeftovers(t *testing.T, ctx context.Context, n *simNode) []leftover {
	t.Helper()
	cl := n.rt.Client()
	var out []leftover
	conts, err := cl.ContainerService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := cl.TaskService().List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]bool{}
	for _, tk := range tasks.Tasks {
		running[tk.ID] = true
	}
	for _, c := range conts {
		if c.Labels[containerd.LabelManaged] == "" {
			continue
		}
		out = append(out, leftover{"container", c.ID, c.Labels[containerd.LabelRole], c.Labels[containerd.LabelOwner]})
		if running[c.ID] {
			out = append(out, leftover{"task", c.ID, c.Labels[containerd.LabelRole], c.Labels[containerd.LabelOwner]})
		}
	}
	err = cl.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind == snapshots.KindActive && i.Labels[containerd.LabelManaged] != "" {
			out = append(out, leftover{"snapshot", i.Name, "", i.Labels[containerd.LabelOwner]})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := cl.LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Labels[containerd.LabelManaged] == "" || l.Labels[containerd.LabelRole] == containerd.PinLeaseRole {
			continue
		}
		out = append(out, leftover{"lease", l.ID, l.Labels[containerd.LabelRole], l.Labels[containerd.LabelOwner]})
	}
	return out
}
