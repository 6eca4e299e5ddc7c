package herd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/distribution/reference"
	"k8s.io/client-go/kubernetes"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/fetchgate"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// Phases is one node's provision in a benchmark, timed at each step:
// Start, the Pulling state (the candidate resolved and chosen), the pull's
// start (the fetch gate let it go), its last layer byte in (progress is
// sampled every 200 ms; gpupin extracts while it downloads), its end (the
// Probing state follows at once), and the end (probed and pinned).
type Phases struct {
	Node   string
	Status provision.Status

	Start, Pulling, PullStart time.Time
	LastByte, PullEnd, End    time.Time

	// Upstream: the pull went to the upstream registry (this node fetched
	// for the fleet, or its gate sent it there); else through its mirror.
	Upstream bool
	Notes    []string
	// API is what the node's fetch gate asked the API server during this
	// provision (nil without the gate).
	API map[string]int
	// APIRequests is the sum of API.
	APIRequests int
}

// Resolve is the time to the Pulling state: plan, resolve, choose.
func (p Phases) Resolve() time.Duration { return sub(p.Pulling, p.Start) }

// Wait is the time the fetch gate held the pull back.
func (p Phases) Wait() time.Duration { return sub(p.PullStart, p.Pulling) }

// Fetch is the time from the pull's start to its last layer byte.
func (p Phases) Fetch() time.Duration { return sub(p.LastByte, p.PullStart) }

// Unpack is the pull's time after its last byte: the extraction's tail,
// the commit of the snapshots and the image record.
func (p Phases) Unpack() time.Duration { return sub(p.PullEnd, p.LastByte) }

// Probe is the time from the pull's end to the pin: the probe and the pin.
func (p Phases) Probe() time.Duration { return sub(p.End, p.PullEnd) }

// Total is the provision's time.
func (p Phases) Total() time.Duration { return sub(p.End, p.Start) }

func sub(a, b time.Time) time.Duration {
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return a.Sub(b)
}

// BenchNode is a node with a provisioner of its own that times each step
// of a provision and counts its fetch gate's API requests. Its options are
// the herd's (startNode's), plus the timing hooks.
type BenchNode struct {
	*Node
	Prov *provision.Provisioner
	API  *APICount

	mu sync.Mutex
	ph Phases
}

// Bench gives node n a timed provisioner (and, with the gate, a gate of
// its own whose client counts its requests).
func (h *Herd) Bench(n *Node) (*BenchNode, error) {
	b := &BenchNode{Node: n, API: NewAPICount()}
	d := n.Daemon
	popts := []provision.Option{
		provision.WithNode(testenv.NewNode(testenv.H100("580.82.07", "13.0"))),
		provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(filepath.Join(d.Dir, "lock")),
		provision.WithProbeDir(filepath.Join(d.Dir, "probe")),
		provision.WithProbeTimeout(60 * time.Second),
		provision.WithOnState(b.onState),
		provision.WithProgress(b.onProgress),
	}
	if h.Cluster != nil {
		g, err := h.countedGate(n, b.API)
		if err != nil {
			return nil, err
		}
		popts = append(popts, provision.WithFetchGate(timedGate{g: noting{g, n}, b: b}))
	} else {
		popts = append(popts, provision.WithFetchGate(timedGate{b: b}))
	}
	p, err := provision.New(n.Runtime, popts...)
	if err != nil {
		return nil, fmt.Errorf("provisioner: %w", err)
	}
	b.Prov = p
	return b, nil
}

// countedGate is the node's fetch gate wired as cmd/gpupin/fetchgate.go
// wires the agent's, its client counting its requests in c (nil: none).
func (h *Herd) countedGate(n *Node, c *APICount) (*fetchgate.Gate, error) {
	cfg := h.Cluster.Config("gpupin:agent:" + n.Name)
	cfg.Timeout = 5 * time.Second
	if c != nil {
		cfg.Wrap(c.Wrap)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("lease client: %w", err)
	}
	rt := n.Runtime
	return fetchgate.New(cs.CoordinationV1(), LeaseNamespace, n.Name,
		fetchgate.WithLeaseDuration(h.opts.LeaseDuration),
		fetchgate.WithMaxWait(h.opts.MaxWait),
		fetchgate.WithMirrors(mirrorsOf(rt)),
		fetchgate.WithLocal(localOf(rt)),
		fetchgate.WithStored(provision.ImageStored(rt)))
}

// mirrorsOf and localOf are h.gate's: the mirrors of the node's hosts
// configuration; an image record of the digested name counts as local.
func mirrorsOf(rt *containerd.Runtime) func(ctx context.Context, ref string) ([]string, error) {
	return func(ctx context.Context, ref string) ([]string, error) {
		named, err := reference.ParseNormalizedNamed(ref)
		if err != nil {
			return nil, fmt.Errorf("reference %s: %w", ref, err)
		}
		m, err := rt.Registry().Mirrors(ctx, reference.Domain(named))
		return m.Hosts, err
	}
}

func localOf(rt *containerd.Runtime) func(ctx context.Context, ref string) bool {
	return func(ctx context.Context, ref string) bool {
		_, err := rt.Client().ImageService().Get(namespaces.WithNamespace(ctx, rt.Namespace()), ref)
		return err == nil
	}
}

func (b *BenchNode) onState(st provision.Status) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st.State == provision.Pulling && b.ph.Pulling.IsZero() {
		b.ph.Pulling = time.Now()
	}
}

func (b *BenchNode) onProgress(_ string, p containerd.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ph.LastByte.IsZero() && p.Total > 0 && p.Done >= p.Total && p.LayersDone >= p.Layers {
		b.ph.LastByte = time.Now()
	}
}

// timedGate runs the node's gate (none: the pull at once) and notes when
// the pull starts and ends.
type timedGate struct {
	g provision.FetchGate
	b *BenchNode
}

func (t timedGate) Fetch(ctx context.Context, ref string, note func(string), pull provision.GatedPull) error {
	timed := func(ctx context.Context, progress func(int64, int64), await func(context.Context, string) error) error {
		t.b.mu.Lock()
		t.b.ph.PullStart = time.Now()
		t.b.mu.Unlock()
		err := pull(ctx, progress, await)
		t.b.mu.Lock()
		t.b.ph.PullEnd = time.Now()
		if t.b.ph.LastByte.IsZero() {
			t.b.ph.LastByte = t.b.ph.PullEnd
		}
		t.b.mu.Unlock()
		return err
	}
	if t.g == nil {
		return timed(ctx, func(int64, int64) {}, nil)
	}
	return t.g.Fetch(ctx, ref, note, timed)
}

// Provision provisions want on the node, timed.
func (b *BenchNode) Provision(ctx context.Context, want provision.Want) Phases {
	b.mu.Lock()
	b.ph = Phases{Node: b.Name}
	b.mu.Unlock()
	b.API.Reset()
	notes := len(b.Notes())
	start := time.Now()
	b.mu.Lock()
	b.ph.Start = start
	b.mu.Unlock()
	st := b.Prov.Provision(ctx, want)
	end := time.Now()
	b.mu.Lock()
	ph := b.ph
	b.mu.Unlock()
	ph.Status, ph.End = st, end
	ph.Notes = b.Notes()[notes:]
	ph.Upstream = true
	for _, s := range ph.Notes {
		if strings.HasPrefix(s, "pulling through the mirror") {
			ph.Upstream = false
		}
	}
	ph.API, ph.APIRequests = b.API.Counts(), b.API.Total()
	return ph
}

// BenchAll has every node in nodes provision want at the same moment (a
// barrier releases them together), each timed, in node order.
func BenchAll(nodes []*BenchNode, want provision.Want) []Phases {
	res := make([]Phases, len(nodes))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res[i] = n.Provision(context.Background(), want)
		}()
	}
	close(start)
	wg.Wait()
	return res
}

// CtrPullAll runs `ctr images pull --hosts-dir` (the node's certs.d, so
// the same Spegel mirror first) for ref on every node in nodes at the
// same moment and returns each one's time, in node order.
func CtrPullAll(nodes []*Node, ref string) ([]time.Duration, error) {
	durs := make([]time.Duration, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			cmd := exec.Command(nd.Daemon.Ctr(), "-a", nd.Daemon.Address, "-n", "k8s.io", "images", "pull", "--hosts-dir", nd.CertsDir, ref)
			if b, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("%s: ctr pull: %v: %s", nd.Name, err, tailOf(b))
			}
			durs[i] = time.Since(t0)
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return durs, err
		}
	}
	return durs, nil
}

func tailOf(b []byte) []byte {
	if len(b) > 2000 {
		return b[len(b)-2000:]
	}
	return b
}

// AppendFile appends s to the file at path (created if need be): the
// benchmark's table rows.
func AppendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
