package herd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/canary"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/fetchgate"
	"github.com/gpupin/gpupin/internal/kubetest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// LeaseNamespace is where the fetch leases live (the manifests' namespace).
const LeaseNamespace = "gpupin-system"

// Options shape a herd.
type Options struct {
	Nodes int
	// Gate turns gpupin's fetch gate on (as the agent's default
	// --fetch-concurrency 1 does); off, every node pulls at once.
	Gate          bool
	LeaseDuration time.Duration // default 3s: a dead fetcher is replaced fast
	MaxWait       time.Duration // default 2 min
	// BlobDir keeps the upstream's blobs on disk (benchmarks).
	BlobDir string
	// StallTimeout is each node's progress deadline (registry.Config;
	// default 60 s): a body that moves too little within it is cut.
	StallTimeout time.Duration
	// CanaryMaxWait, when not 0, gives every node a canary gate (as the
	// agent's default --canary does) with this max wait and the lease's
	// duration. No agent writes GPUPinNode statuses here, so a canary
	// hands on no verdict: it releases its lease after a second.
	CanaryMaxWait time.Duration
	// OnCanary is called when a node becomes its class's canary, before
	// its provision goes on: where a test's fault strikes, with no race
	// against the canary's own progress.
	OnCanary func(n *Node)
}

// Herd is the simulated fleet.
type Herd struct {
	Upstream *Upstream
	Cluster  *kubetest.Cluster // nil without the gate
	Nodes    []*Node
	opts     Options
}

// Node is one simulated node.
type Node struct {
	Name     string
	Index    int
	Daemon   *sandbox.Containerd
	Runtime  *containerd.Runtime
	Spegel   *SpegelProc
	CertsDir string
	Gate     *fetchgate.Gate // nil without the gate
	Prov     *provision.Provisioner

	mu    sync.Mutex
	notes []string
}

// Notes are the gates' lines for this node so far (why it waited, who
// fetched, why it went upstream; its canary's, with CanaryMaxWait).
func (n *Node) Notes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.notes...)
}

// noting records the gate's notes on the node as they reach the status.
type noting struct {
	g *fetchgate.Gate
	n *Node
}

func (w noting) Fetch(ctx context.Context, ref string, note func(string), pull provision.GatedPull) error {
	return w.g.Fetch(ctx, ref, func(s string) {
		w.n.note(s)
		note(s)
	}, pull)
}

// notingCanary records what the node's canary gate said, for the tests'
// checks: whom it waited on ("waiting on canary N"), and how the wait
// ended ("canary verdict from N", "no canary verdict: why", "canary",
// "canary not asked: why").
type notingCanary struct {
	c      provision.Canary
	n      *Node
	onLead func(*Node)
}

func (w notingCanary) Await(ctx context.Context, class, key string, note func(string)) (provision.CanaryVerdict, func(), error) {
	v, done, err := w.c.Await(ctx, class, key, func(canary string) {
		w.n.note("waiting on canary " + canary)
		note(canary)
	})
	switch {
	case err != nil:
		w.n.note("canary not asked: " + err.Error())
	case done != nil:
		w.n.note("canary")
		if w.onLead != nil {
			w.onLead(w.n)
		}
	case v.Node == "":
		w.n.note("no canary verdict: " + v.Reason)
	default:
		w.n.note("canary verdict from " + v.Node)
	}
	return v, done, err
}

func (n *Node) note(s string) {
	n.mu.Lock()
	n.notes = append(n.notes, s)
	n.mu.Unlock()
}

// Start builds the herd: the upstream, the API server (with the gate),
// and Nodes nodes, each a containerd of the release under test
// ($GPUPIN_TEST_CONTAINERD, else PATH's) with Spegel beside it. Everything
// stops at the test's end. A missing Spegel or kube-apiserver fails.
func Start(t testing.TB, opts Options) *Herd {
	t.Helper()
	testenv.RequireRoot(t)
	if !Inside() {
		t.Fatal("herd: not in the herd's network namespace: call herd.Main from TestMain")
	}
	if opts.Nodes < 1 || opts.Nodes > MaxNodes {
		t.Fatalf("herd: %d nodes: 1 to %d", opts.Nodes, MaxNodes)
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 3 * time.Second
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = 2 * time.Minute
	}
	up, err := StartUpstream(opts.BlobDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	h := &Herd{Upstream: up, opts: opts}
	if opts.Gate {
		var users []kubetest.User
		for i := range opts.Nodes {
			users = append(users, kubetest.User{Name: "gpupin:agent:" + NodeName(i), Groups: []string{"gpupin:agents"}})
		}
		root := RepoRoot()
		h.Cluster = kubetest.StartT(t, []string{
			filepath.Join(root, "deploy/kubernetes/fleet-crds.yaml"),
			filepath.Join(root, "deploy/kubernetes/fleet-rbac.yaml"),
		}, users...)
	}
	// Nodes start one after the other: each Spegel bootstraps from node
	// 0's, which must be up first; the rest is cheap next to the pulls.
	for i := range opts.Nodes {
		n, err := h.startNode(t, i)
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		h.Nodes = append(h.Nodes, n)
	}
	// Readiness is a peer in the routing table: a lone node never has one.
	for _, n := range h.Nodes {
		if len(h.Nodes) == 1 {
			break
		}
		if err := n.Spegel.WaitReady(30 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// NodeName is node i's name (its Node's, its lease identity).
func NodeName(i int) string { return "node-" + strconv.Itoa(i) }

// UpstreamURL is the upstream as hosts.toml and Spegel name it.
func (h *Herd) UpstreamURL() string { return "http://" + h.Upstream.Host }

func (h *Herd) startNode(t testing.TB, i int) (*Node, error) {
	d, err := sandbox.StartContainerd(context.Background(), sandbox.ContainerdOptions{})
	if err != nil {
		return nil, err
	}
	t.Cleanup(d.Stop)
	n := &Node{Name: NodeName(i), Index: i, Daemon: d, CertsDir: filepath.Join(d.Dir, "certs.d")}
	sp, err := StartSpegel(d.Dir, Addr(i), Addr(0), d.Address,
		filepath.Join(d.Dir, "root", "io.containerd.content.v1.content"), h.UpstreamURL())
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("HERD_LOG") != "" {
			t.Logf("%s's spegel log:\n%s", n.Name, sp.LogTail())
		}
		sp.Stop()
	})
	n.Spegel = sp
	if err := WriteHostsToml(n.CertsDir, h.UpstreamURL(), sp.MirrorURL()); err != nil {
		return nil, err
	}
	cdi := filepath.Join(d.Dir, "cdi")
	os.MkdirAll(cdi, 0o755)
	unpack, err := containerd.ParseUnpack(os.Getenv(containerd.EnvUnpack))
	if err != nil {
		return nil, err
	}
	// As the agent connects under Kubernetes: namespace k8s.io (the one
	// Spegel serves), the node's certs.d. Layers are stored because
	// hosts.toml names a mirror (containerd.WithKeepLayers' default).
	rt, err := containerd.Connect(context.Background(), d.Address,
		containerd.WithNamespace("k8s.io"),
		containerd.WithRegistry(registry.New(registry.Config{HostsDir: n.CertsDir, StallTimeout: h.opts.StallTimeout})),
		containerd.WithUnpack(unpack),
		containerd.WithRuncRoot(d.RuncRoot),
		containerd.WithFIFODir(filepath.Join(d.Dir, "fifo")),
		containerd.WithCDISpecDirs(cdi))
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	t.Cleanup(func() { rt.Close() })
	n.Runtime = rt
	popts := []provision.Option{
		provision.WithNode(testenv.NewNode(testenv.H100("580.82.07", "13.0"))),
		provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(filepath.Join(d.Dir, "lock")),
		provision.WithProbeDir(filepath.Join(d.Dir, "probe")),
		provision.WithProbeTimeout(60 * time.Second),
	}
	if h.Cluster != nil {
		g, err := h.gate(n)
		if err != nil {
			return nil, err
		}
		n.Gate = g
		popts = append(popts, provision.WithFetchGate(noting{g, n}))
		if h.opts.CanaryMaxWait > 0 {
			c, err := h.canary(n)
			if err != nil {
				return nil, err
			}
			popts = append(popts, provision.WithCanary(notingCanary{c, n, h.opts.OnCanary}))
		}
	}
	for _, dir := range []string{"lock", "probe"} {
		os.MkdirAll(filepath.Join(d.Dir, dir), 0o755)
	}
	p, err := provision.New(rt, popts...)
	if err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	n.Prov = p
	return n, nil
}

// gate is the node's fetch gate wired as cmd/gpupin/fetchgate.go wires the
// agent's (countedGate, counting nothing).
func (h *Herd) gate(n *Node) (*fetchgate.Gate, error) { return h.countedGate(n, nil) }

// canary is the node's canary gate wired as cmd/gpupin/canary.go wires the
// agent's: its leases beside the fetch leases, verdicts read from the
// GPUPinNodes (none here: a canary's lease is released after a second).
func (h *Herd) canary(n *Node) (*canary.Gate, error) {
	cfg := h.Cluster.Config("gpupin:agent:" + n.Name)
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("canary lease client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("canary verdict client: %w", err)
	}
	return canary.New(cs.CoordinationV1(), dyn, LeaseNamespace, n.Name,
		canary.WithLeaseDuration(h.opts.LeaseDuration), canary.WithMaxWait(h.opts.CanaryMaxWait),
		canary.WithStatusWait(time.Second))
}

// Result is one node's provision.
type Result struct {
	Node     string
	Status   provision.Status
	Start    time.Time
	Duration time.Duration
}

// ProvisionAll has every node provision want at the same moment (a
// barrier releases them together) and returns each node's result, in node
// order. ctxFor gives node i's context (nil: background).
func (h *Herd) ProvisionAll(want provision.Want, ctxFor func(i int) context.Context) []Result {
	res := make([]Result, len(h.Nodes))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, n := range h.Nodes {
		ctx := context.Background()
		if ctxFor != nil {
			ctx = ctxFor(i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			st := n.Prov.Provision(ctx, want)
			res[i] = Result{Node: n.Name, Status: st, Start: t0, Duration: time.Since(t0)}
		}()
	}
	close(start)
	wg.Wait()
	return res
}

// PublishEngine publishes engine:1.0 upstream, one variant (cu129,
// which the simulated H100 on a 13.0 driver runs) of busybox and layers
// random layers of layerSize bytes, and returns the tag and the bytes of
// blobs a pull of it fetches (config and layers: one image's cost).
func (h *Herd) PublishEngine(engine string, layers int, layerSize int64) (string, int64, error) {
	v := testenv.CU129
	for range layers {
		l, err := sandbox.RandomLayer(layerSize)
		if err != nil {
			return "", 0, fmt.Errorf("random layer: %w", err)
		}
		v.Layers = append(v.Layers, l)
	}
	if _, err := sandbox.PublishEngine(context.Background(), h.Upstream.Host, engine, "1.0", []sandbox.EngineVariant{v}); err != nil {
		return "", 0, fmt.Errorf("publish %s: %w", engine, err)
	}
	ref := h.Upstream.Host + "/" + engine + ":1.0-cu129"
	img, err := remote.Image(mustRef(ref))
	if err != nil {
		return "", 0, fmt.Errorf("read back %s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return "", 0, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	total := m.Config.Size
	for _, l := range m.Layers {
		total += l.Size
	}
	return h.Upstream.Host + "/" + engine + ":1.0", total, nil
}

func mustRef(s string) name.Reference {
	r, err := name.ParseReference(s)
	if err != nil {
		panic(err)
	}
	return r
}

// Fetcher is the node that holds a fetch lease for a digest now, with
// the lease's state ("" when no lease is held).
func (h *Herd) Fetcher(ctx context.Context) (node, state string, err error) {
	cs, err := kubernetes.NewForConfig(h.Cluster.Admin())
	if err != nil {
		return "", "", fmt.Errorf("admin client: %w", err)
	}
	ls, err := cs.CoordinationV1().Leases(LeaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: fetchgate.LabelDigest})
	if err != nil {
		return "", "", fmt.Errorf("list fetch leases: %w", err)
	}
	for _, l := range ls.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Annotations[fetchgate.AnnotState] == fetchgate.StateFetching {
			return *l.Spec.HolderIdentity, fetchgate.StateFetching, nil
		}
	}
	return "", "", nil
}

// Node returns the node named name.
func (h *Herd) Node(name string) *Node {
	for _, n := range h.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}
