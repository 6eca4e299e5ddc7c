// Package herd_test is the fault suite's rollout part: a herd of simulated
// nodes (internal/herd), each its own containerd of the release under test
// and a real Spegel v0.7.4 as its mirror through certs.d/hosts.toml, one
// upstream registry that counts blob bytes, one kube-apiserver for the
// fetch gate; every node's provisioner wants the same new engine image at
// the same moment. In ./faults/..., so `make test` runs it against every
// containerd release of the suite.
package herd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/internal/herd"
	"github.com/gpupin/gpupin/provision"
)

func TestMain(m *testing.M) { herd.Main(m) }

const (
	nodes = 4
	// 48 MiB of layers, in eight: the suite's time stays small, and a
	// layer Spegel cannot hand over in time (its proxy gives up on a peer
	// whose answer takes more than max(2x its usual, 100 ms), which a
	// loaded 2-core machine reaches) costs an eighth of an image, not a
	// third.
	layers    = 8
	layerSize = 6 << 20
	lease     = 3 * time.Second
	maxWait   = 60 * time.Second
	// bound is the longest any node may take, its wait included: the
	// gate's MaxWait plus a pull of its own after it. A node past it
	// waited longer than the gate allows.
	bound = maxWait + 30*time.Second
	// slowLink is the upstream's rate per response in the fault cases,
	// so that a fetch is still under way when the fault strikes (the
	// three layers come in parallel: about 4 s for the image).
	slowLink = 4 << 20
)

func start(t *testing.T) (*herd.Herd, string, int64) {
	t.Helper()
	return startWith(t, herd.Options{}, layers, layerSize)
}

func startWith(t *testing.T, opts herd.Options, layers int, layerSize int64) (*herd.Herd, string, int64) {
	t.Helper()
	opts.Nodes, opts.Gate, opts.LeaseDuration, opts.MaxWait = nodes, true, lease, maxWait
	h := herd.Start(t, opts)
	ref, size, err := h.PublishEngine("vllm", layers, layerSize)
	if err != nil {
		t.Fatal(err)
	}
	h.Upstream.ResetCount()
	return h, ref, size
}

// check fails unless every node in want is pinned within the bound, and
// logs the figures; it returns the images taken from upstream.
func check(t *testing.T, h *herd.Herd, res []herd.Result, size int64, skip string) float64 {
	t.Helper()
	var last time.Duration
	for _, r := range res {
		if r.Node == skip {
			continue
		}
		t.Logf("%s: %s in %s (%s); gate: %q", r.Node, r.Status.State, r.Duration.Round(time.Millisecond), r.Status.Detail, h.Node(r.Node).Notes())
		if r.Status.State != provision.Ready || r.Status.Pinned == "" {
			t.Errorf("%s: %s, want ready and pinned: %s (%v)", r.Node, r.Status.State, r.Status.Detail, r.Status.Err)
		}
		if r.Duration > bound {
			t.Errorf("%s took %s, past the bound %s", r.Node, r.Duration, bound)
		}
		last = max(last, r.Duration)
	}
	images := float64(h.Upstream.BlobBytes()) / float64(size)
	t.Logf("upstream served %.2f images (%d of %d bytes each), makespan %s", images, h.Upstream.BlobBytes(), size, last.Round(time.Millisecond))
	return images
}

// samePin fails unless every node pinned one digest.
func samePin(t *testing.T, res []herd.Result) {
	t.Helper()
	for _, r := range res[1:] {
		if r.Status.Pinned != res[0].Status.Pinned {
			t.Errorf("%s pinned %s, %s pinned %s", r.Node, r.Status.Pinned, res[0].Node, res[0].Status.Pinned)
		}
	}
}

// TestHerdSimulatedOneFetch: four nodes want one new image at once; the
// gate lets one fetch it from upstream and the rest pull it through their
// Spegel, which has it from that node: about one image leaves upstream.
func TestHerdSimulatedOneFetch(t *testing.T) {
	h, ref, size := start(t)
	res := h.ProvisionAll(provision.Want{Ref: ref}, nil)
	images := check(t, h, res, size, "")
	samePin(t, res)
	// On every release: below 2.1, where the daemon publishes no
	// /content/create, gpupin publishes it for the blobs it commits
	// (pull.announcing), which is what Spegel advertises fresh blobs on.
	if limit := 1.25; images > limit {
		t.Errorf("upstream served %.2f images for %d nodes on containerd %s, want at most %.2f", images, nodes, h.Nodes[0].Daemon.Version, limit)
	}
}

// waitFetcher waits for a node to hold a fetch lease and for the upstream
// to have served some of the image (its pull is under way), and returns
// that node.
func waitFetcher(t *testing.T, h *herd.Herd, size int64) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		node, _, err := h.Fetcher(context.Background())
		if err != nil {
			t.Logf("fetcher: %v", err)
		}
		if got := h.Upstream.BlobBytes(); node != "" && got > size/8 && got < size*3/4 {
			return node
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no node was seen fetching within 30s (upstream served %d bytes)", h.Upstream.BlobBytes())
	return ""
}

// TestHerdSimulatedFetcherKilled: the fetching node dies mid-pull (its
// provisioner stops, so its lease is no longer renewed, and its Spegel is
// killed). Another node takes the lease within its duration and fetches;
// the others pull through their mirrors; the dead node, back, pins too.
func TestHerdSimulatedFetcherKilled(t *testing.T) {
	h, ref, size := start(t)
	h.Upstream.SetRate(slowLink)
	ctxs := make([]context.Context, nodes)
	cancels := make([]context.CancelFunc, nodes)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
		defer cancels[i]()
	}
	killed := make(chan string, 1)
	go func() {
		name := waitFetcher(t, h, size)
		n := h.Node(name)
		cancels[n.Index]()
		n.Spegel.Kill()
		killed <- name
	}()
	res := h.ProvisionAll(provision.Want{Ref: ref}, func(i int) context.Context { return ctxs[i] })
	dead := <-killed
	t.Logf("killed %s mid-pull", dead)
	h.Upstream.SetRate(0)
	images := check(t, h, res, size, dead)
	// The dead node's part and about one more.
	if limit := 2.25; images > limit {
		t.Errorf("upstream served %.2f images on containerd %s, want at most %.2f: the dead node's part and about one more", images, h.Nodes[0].Daemon.Version, limit)
	}
	// The node comes back (its Spegel too) and provisions again.
	n := h.Node(dead)
	if err := n.Spegel.Start(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	st := n.Prov.Provision(context.Background(), provision.Want{Ref: ref})
	res[n.Index] = herd.Result{Node: dead, Status: st, Duration: time.Since(t0)}
	check(t, h, res, size, "")
	samePin(t, res)
}

// TestHerdSimulatedMirrorKilled: the fetching node's Spegel dies while the
// others wait for it. The fetch goes on; with every byte in, the fetcher
// finds its mirror gone and marks its lease unserved, so one waiter
// fetches in its place and the rest pull through their mirrors from it:
// about two images, not one per node. Every node pins, none waits past
// the bound.
func TestHerdSimulatedMirrorKilled(t *testing.T) {
	h, ref, size := start(t)
	h.Upstream.SetRate(slowLink)
	killed := make(chan string, 1)
	go func() {
		name := waitFetcher(t, h, size)
		h.Node(name).Spegel.Kill()
		killed <- name
	}()
	res := h.ProvisionAll(provision.Want{Ref: ref}, nil)
	fetcher := <-killed
	t.Logf("killed %s's spegel while it fetched", fetcher)
	images := check(t, h, res, size, "")
	samePin(t, res)
	// The killed node's fetch and its successor's.
	if limit := 2.25; images > limit {
		t.Errorf("upstream served %.2f images on containerd %s, want at most %.2f", images, h.Nodes[0].Daemon.Version, limit)
	}
}

// TestHerdSimulatedBigLayerSlowLink: one big layer over a slow link (a
// 15 GB layer at 30 MB/s takes over 8 minutes; containerd's own
// deadline cut such a layer at 14.5 GB, its issue 12811). Here 40 MiB at
// 2 MiB/s: 20 s, ten times each node's progress deadline and more than
// six lease durations. Nothing may cut it for the time it takes: the
// pull's deadline counts progress (bytes moved within the window), the
// fetcher's lease is renewed while bytes move, so no node takes over and
// fetches again, and every node pins within the bound.
func TestHerdSimulatedBigLayerSlowLink(t *testing.T) {
	const stall = 2 * time.Second
	h, ref, size := startWith(t, herd.Options{StallTimeout: stall}, 1, 40<<20)
	h.Upstream.SetRate(2 << 20)
	res := h.ProvisionAll(provision.Want{Ref: ref}, nil)
	h.Upstream.SetRate(0)
	images := check(t, h, res, size, "")
	samePin(t, res)
	var longest time.Duration
	for _, r := range res {
		longest = max(longest, r.Duration)
	}
	if longest < 5*stall {
		t.Errorf("the slowest node took %s: the link was not slow enough to outlast the progress deadline (%s) many times over", longest, stall)
	}
	if limit := 1.25; images > limit {
		t.Errorf("upstream served %.2f images on containerd %s, want at most %.2f: a lease was lost to a fetch that kept moving", images, h.Nodes[0].Daemon.Version, limit)
	}
}

// TestHerdSimulatedAPIServerRestarted: the API server goes away for 3 s
// (a lease duration) while one node fetches and the others wait on its
// lease, then comes back. The fetch goes on (its renewals fail, and are
// made again once the server answers); the waiters' watches end and are
// made again. Every node pins within the bound, none takes a second
// image because of the outage alone, whatever it did meanwhile.
func TestHerdSimulatedAPIServerRestarted(t *testing.T) {
	h, ref, size := start(t)
	h.Upstream.SetRate(slowLink)
	restarted := make(chan error, 1)
	go func() {
		name := waitFetcher(t, h, size)
		t.Logf("%s fetches: the API server stops for %s", name, lease)
		h.Cluster.StopAPIServer()
		time.Sleep(lease)
		restarted <- h.Cluster.StartAPIServer()
	}()
	res := h.ProvisionAll(provision.Want{Ref: ref}, nil)
	if err := <-restarted; err != nil {
		t.Fatalf("API server not restarted: %v", err)
	}
	h.Upstream.SetRate(0)
	images := check(t, h, res, size, "")
	samePin(t, res)
	// A waiter that saw the server gone for a lease duration fetches
	// from upstream itself (the gate's rule); at worst each node takes
	// one image, as without the gate.
	if limit := float64(nodes) + 0.25; images > limit {
		t.Errorf("upstream served %.2f images on containerd %s, more than one per node (%.2f)", images, h.Nodes[0].Daemon.Version, limit)
	}
}

// TestHerdSimulatedCanaryHangs: a new version on one GPU class, the canary
// gate on every node (the agent's default). The node that becomes the
// class's canary hangs as soon as it does: its containerd is frozen
// (SIGSTOP), so each of its calls blocks, while its agent goes on renewing
// the canary lease. The others wait on it no longer than the canary's max
// wait, then try the candidates themselves, through the fetch gate; once
// they are pinned the canary's daemon goes on, and it pins too. No node
// waits past its bound, every node pins the same digest.
func TestHerdSimulatedCanaryHangs(t *testing.T) {
	const canaryWait = 6 * time.Second
	frozen := make(chan string, nodes)
	hang := func(n *herd.Node) {
		if err := n.Daemon.Freeze(); err != nil {
			t.Errorf("freeze %s's containerd: %v", n.Name, err)
		}
		// A failed test leaves no daemon stopped under its cleanup.
		t.Cleanup(func() { n.Daemon.Thaw() })
		frozen <- n.Name
	}
	h, ref, size := startWith(t, herd.Options{CanaryMaxWait: canaryWait, OnCanary: hang}, layers, layerSize)
	res := make([]herd.Result, nodes)
	done := make(chan herd.Result, nodes)
	for _, n := range h.Nodes {
		go func() {
			t0 := time.Now()
			st := n.Prov.Provision(context.Background(), provision.Want{Ref: ref})
			done <- herd.Result{Node: n.Name, Status: st, Start: t0, Duration: time.Since(t0)}
		}()
	}
	var canary string
	select {
	case canary = <-frozen:
	case <-time.After(bound):
		t.Fatalf("no node became the canary within %s", bound)
	}
	t.Logf("%s became the canary: its containerd is frozen", canary)
	// The others must finish while it hangs: that is the bound's point.
	for range nodes - 1 {
		var r herd.Result
		select {
		case r = <-done:
		case <-time.After(2 * bound):
			t.Fatalf("the nodes beside the frozen canary %s did not finish within %s", canary, 2*bound)
		}
		if r.Node == canary {
			t.Fatalf("the frozen canary %s finished first: %s (%s)", canary, r.Status.State, r.Status.Detail)
		}
		res[h.Node(r.Node).Index] = r
	}
	if err := h.Node(canary).Daemon.Thaw(); err != nil {
		t.Fatalf("thaw %s's containerd: %v", canary, err)
	}
	r := <-done
	res[h.Node(r.Node).Index] = r
	images := check(t, h, res, size, "")
	samePin(t, res)
	for _, r := range res {
		if r.Node == canary {
			continue
		}
		notes := strings.Join(h.Node(r.Node).Notes(), "; ")
		if !strings.Contains(notes, "waiting on canary "+canary) || !strings.Contains(notes, "no canary verdict: no verdict from canary "+canary+" within "+canaryWait.String()) {
			t.Errorf("%s: notes %q, want it to have waited on canary %s and given up after %s", r.Node, notes, canary, canaryWait)
		}
		// It waited the canary's bound, and not much past it: then its own
		// provision.
		if r.Duration < canaryWait || r.Duration > canaryWait+bound {
			t.Errorf("%s took %s: want at least the canary's max wait %s, and within it and a provision (%s)", r.Node, r.Duration, canaryWait, bound)
		}
	}
	// One fetch for the class: the canary froze before its pull began.
	if limit := 1.25; images > limit {
		t.Errorf("upstream served %.2f images on containerd %s, want at most %.2f", images, h.Nodes[0].Daemon.Version, limit)
	}
}
