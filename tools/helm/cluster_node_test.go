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

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/node"
)

// The host paths a node's kubelet, containerd, nfd-worker and gpupin agent
// share by name. Each simulated node has its own (sandbox.NodeNS), so the
// chart's hostPath defaults mean on it what they mean on a real node.
var nodePaths = []string{
	"/var/lib/gpupin", "/run/gpupin", "/tmp/gpupin-fifo",
	"/etc/kubernetes/node-feature-discovery/features.d",
	"/var/lib/kubelet", "/var/lib/containerd", "/etc/containerd/certs.d",
	"/etc/gpupin-sim", "/run/containerd",
}

// simNodeFile is where each simulated node keeps its facts: the chart's
// simulated.nodeFile.
const simNodeFile = "/etc/gpupin-sim/node.json"

// simSocket is the node's containerd socket as its pods see it: the
// daemon's directory is bound at /run/containerd in the node's namespace.
const simSocket = "/run/containerd/c.sock"

// simNode is a simulated GPU node: its own mount namespace, containerd
// with CRI, a kubelet registered with the cluster, and nfd-worker.
type simNode struct {
	name    string
	ns      *sandbox.NodeNS
	ctd     *sandbox.Containerd
	rt      *containerd.Runtime // k8s.io, the namespace the agent and kubelet use
	kubelet *kubetest.Kubelet
	nfd     *exec.Cmd
}

// startSimNode brings a node up and waits until it is a Ready Node of the
// cluster with one nvidia.com/gpu to offer.
func startSimNode(t *testing.T, c *kubetest.Cluster, name string, facts *node.Facts, regHost, pause string) *simNode {
	t.Helper()
	ctx := context.Background()
	n := &simNode{name: name}
	dir, err := os.MkdirTemp("/tmp", "gpupin-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if n.ns, err = sandbox.StartNodeNS(dir, nodePaths...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.ns.Stop)
	// The registry over plain HTTP, for kubelet's pulls (gpupin's image)
	// and the agent's (the engine), from the node's certs.d.
	hostsDir := filepath.Join(n.ns.Path("/etc/containerd/certs.d"), regHost)
	hosts := fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+regHost, "http://"+regHost)
	if err := os.MkdirAll(hostsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostsDir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(facts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.ns.Path(simNodeFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	n.ctd, err = sandbox.StartContainerd(ctx, sandbox.ContainerdOptions{CRI: true, CNILoopback: true,
		Root: "/var/lib/containerd", RegistryConfigPath: "/etc/containerd/certs.d", SandboxImage: pause, Wrap: n.ns.Enter()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.ctd.Stop)
	if err := n.ns.BindMount(n.ctd.Dir, "/run/containerd"); err != nil {
		t.Fatal(err)
	}
	n.rt, err = containerd.Connect(ctx, n.ctd.Address, containerd.WithNamespace("k8s.io"),
		containerd.WithRuncRoot(n.ctd.RuncRoot), containerd.WithFIFODir(filepath.Join(n.ctd.Dir, "fifo")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.rt.Close() })
	n.putPause(t, regHost, pause)

	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	// The NVIDIA GPU operator's label, which the chart's nodeSelector asks for.
	n.kubelet = kubetest.StartKubelet(t, kubetest.KubeletOptions{Endpoint: n.ctd.CRIEndpoint(), NodeName: name,
		Labels: map[string]string{"nvidia.com/gpu.present": "true"}, Kubeconfig: kc, Wrap: n.ns.Enter()})
	cs := kubernetes.NewForConfigOrDie(c.Admin())
	waitFor(t, 90*time.Second, "node "+name+" Ready", func() (bool, string) {
		nd, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range nd.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, cond.Reason + ": " + cond.Message
			}
		}
		return false, "no Ready condition"
	})
	// The GPU a device plugin would advertise: the engine's pods ask for
	// one. Kubelet keeps an extended resource it does not manage.
	patch := []byte(`[{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "1"}]`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	n.startNFDWorker(t, kc)
	return n
}

// putPause puts a sleeping image under the CRI plugin's pause name
// (registry.k8s.io cannot be reached here).
func (n *simNode) putPause(t *testing.T, regHost, pause string) {
	t.Helper()
	ctx := context.Background()
	img, err := sandbox.Image(sandbox.ImageSpec{Entrypoint: []string{"sleep", "3600"}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := sandbox.PushImage(ctx, regHost+"/pause:1", img)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := n.rt.Pull(ctx, regHost+"/pause@"+d.String(), containerd.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nctx := namespaces.WithNamespace(ctx, "k8s.io")
	is := n.rt.Client().ImageService()
	rec, err := is.Get(nctx, pulled.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := is.Create(nctx, images.Image{Name: pause, Target: rec.Target}); err != nil {
		t.Fatal(err)
	}
}

// startNFDWorker runs nfd-worker in the node's namespace, reading the
// node's feature directory (its local source only) and publishing
// NodeFeature objects for nfd-master, every 2 s.
func (n *simNode) startNFDWorker(t *testing.T, kubeconfig string) {
	t.Helper()
	bin := filepath.Join(tools(), "nfd-worker")
	log, err := os.Create(filepath.Join(n.ns.Dir, "nfd-worker.log"))
	if err != nil {
		t.Fatal(err)
	}
	enter := n.ns.Enter()
	args := append(enter[1:len(enter):len(enter)], bin, "-kubeconfig="+kubeconfig,
		"-feature-sources=local", "-label-sources=local", "-config="+filepath.Join(n.ns.Dir, "nfd-worker.conf"),
		"-metrics=0", "-grpc-health=0", "-v=2")
	if err := os.WriteFile(filepath.Join(n.ns.Dir, "nfd-worker.conf"), []byte("core:\n  sleepInterval: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(enter[0], args...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+n.name, "KUBERNETES_NAMESPACE="+nfdNamespace)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.nfd = cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
}

// nfdLog is the end of the node's nfd-worker log.
func (n *simNode) nfdLog() string { return tailFile(filepath.Join(n.ns.Dir, "nfd-worker.log")) }

func tailFile(p string) string {
	b, _ := os.ReadFile(p)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return strings.TrimSpace(string(b))
}

// tools is where scripts/deps.sh caches the Go-built tools.
func tools() string {
	if d := os.Getenv("GPUPIN_TOOLS"); d != "" {
		return d
	}
	return "/var/tmp/gpupin-tools"
}

// waitFor polls ok every 250 ms until it says true; past limit the test
// fails with what ok last said.
func waitFor(t *testing.T, limit time.Duration, what string, ok func() (bool, string)) {
	t.Helper()
	lastWait = what
	deadline := time.Now().Add(limit)
	for {
		done, last := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			lastWait = fmt.Sprintf("%s: not after %s: %s", what, limit, last)
			t.Fatalf("%s", lastWait)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// lastWait is the wait begun last, or how it failed: said again after the
// daemons' logs at a failure, where CI's tail of the output shows it.
var lastWait string
