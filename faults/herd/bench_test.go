package herd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gpupin/gpupin/internal/herd"
	"github.com/gpupin/gpupin/provision"
)

// TestHerdBench is `make bench-herd`: with GPUPIN_HERD_BENCH=FILE it appends
// a table row per case to FILE, for GPUPIN_HERD_NODES (default "4 8") nodes
// at once and an image of GPUPIN_HERD_MB (default 288) MB in 8 layers:
// gpupin with the fetch gate on every node, `ctr images pull --hosts-dir`
// on every node (the same Spegel mirrors), and one node alone (gpupin).
// Without the variable it is not a test: it measures.
func TestHerdBench(t *testing.T) {
	out := os.Getenv("GPUPIN_HERD_BENCH")
	if out == "" {
		t.Skip("a benchmark: make bench-herd sets GPUPIN_HERD_BENCH")
	}
	mb := 288
	if v := os.Getenv("GPUPIN_HERD_MB"); v != "" {
		mb, _ = strconv.Atoi(v)
	}
	counts := []int{4, 8}
	if v := os.Getenv("GPUPIN_HERD_NODES"); v != "" {
		counts = nil
		for _, f := range splitFields(v) {
			n, _ := strconv.Atoi(f)
			counts = append(counts, n)
		}
	}
	f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, n := range counts {
		h := herd.Start(t, herd.Options{Nodes: n, Gate: true, BlobDir: t.TempDir()})
		version := h.Nodes[0].Daemon.Version
		row := func(what string, images float64, makespan time.Duration) {
			fmt.Fprintf(f, "| %s | %d | %s | %.2f | %.1f s |\n", version, n, what, images, makespan.Seconds())
			t.Logf("%s, %d nodes, %s: %.2f images, %.1f s", version, n, what, images, makespan.Seconds())
		}
		layer := int64(mb) << 20 / 8
		// One image per case: no case finds another's layers.
		refAlone, size, err := h.PublishEngine("alone", 8, layer)
		if err != nil {
			t.Fatal(err)
		}
		refGpupin, _, err := h.PublishEngine("gpupin", 8, layer)
		if err != nil {
			t.Fatal(err)
		}
		refCtr, _, err := h.PublishEngine("ctr", 8, layer)
		if err != nil {
			t.Fatal(err)
		}

		h.Upstream.ResetCount()
		t0 := time.Now()
		if st := h.Nodes[0].Prov.Provision(context.Background(), provision.Want{Ref: refAlone}); st.State != provision.Ready {
			t.Fatalf("alone: %s", st)
		}
		row("one node alone (gpupin)", float64(h.Upstream.BlobBytes())/float64(size), time.Since(t0))

		h.Upstream.ResetCount()
		res := h.ProvisionAll(provision.Want{Ref: refGpupin}, nil)
		var last time.Duration
		for _, r := range res {
			if r.Status.State != provision.Ready {
				t.Fatalf("%s: %s", r.Node, r.Status)
			}
			last = max(last, r.Duration)
		}
		row("gpupin, fetch gate, every node", float64(h.Upstream.BlobBytes())/float64(size), last)

		h.Upstream.ResetCount()
		var wg sync.WaitGroup
		durs := make([]time.Duration, n)
		start := make(chan struct{})
		for i, nd := range h.Nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				cmd := exec.Command(nd.Daemon.Ctr(), "-a", nd.Daemon.Address, "-n", "k8s.io", "images", "pull", "--hosts-dir", nd.CertsDir, refCtr+"-cu129")
				if b, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("%s: ctr pull: %v: %s", nd.Name, err, b)
				}
				durs[i] = time.Since(t0)
			}()
		}
		close(start)
		wg.Wait()
		last = 0
		for _, d := range durs {
			last = max(last, d)
		}
		row("ctr images pull --hosts-dir, every node", float64(h.Upstream.BlobBytes())/float64(size), last)
	}
}

func splitFields(s string) []string {
	var out []string
	cur := ""
	for _, c := range s + " " {
		if c == ' ' || c == ',' {
			if cur != "" {
				out = append(out, cur)
			}
			cur = ""
			continue
		}
		cur += string(c)
	}
	return out
}
