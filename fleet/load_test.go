package fleet_test

import (
	"context"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/node"
)

// countingTransport counts a client's requests, and its watches apart.
type countingTransport struct {
	rt               http.RoundTripper
	mu               sync.Mutex
	requests, watchs int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.requests++
	if r.URL.Query().Get("watch") == "true" {
		c.watchs++
	}
	c.mu.Unlock()
	return c.rt.RoundTrip(r)
}

func (c *countingTransport) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests, c.watchs
}

// BenchmarkAPILoadAtRest measures one node's API load with nothing
// changing: the requests its fleet layer makes over GPUPIN_LOAD_WINDOW
// (default 3 minutes) once started, with the wants ConfigMap watched, and
// the watches it opened. A benchmark, not a test: it idles for minutes.
//
//	go test -run '^$' -bench APILoadAtRest -benchtime 1x ./fleet/
func BenchmarkAPILoadAtRest(b *testing.B) {
	if cluster == nil {
		b.Fatal("no API server")
	}
	window := 3 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("GPUPIN_LOAD_WINDOW")); err == nil {
		window = d
	}
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		cfg := cluster.Config("gpupin:agent:node-a")
		ct := &countingTransport{}
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { ct.rt = rt; return ct }
		n, err := fleet.NewNode(fleet.NodeOptions{Config: cfg, NodeName: "node-a", WantsConfigMap: "gpupin-system/gpupin-agent",
			Facts: node.Static{Facts: &node.Facts{Driver: "580.82.07", CUDA: "13.0", Simulated: true}}})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.Start(ctx, newFakeAgent()); err != nil {
			b.Fatal(err)
		}
		time.Sleep(5 * time.Second) // the start's listings and first status write
		r0, w0 := ct.counts()
		time.Sleep(window)
		r1, w1 := ct.counts()
		cancel()
		n.Wait()
		perMin := float64(r1-r0) / window.Minutes()
		b.ReportMetric(perMin, "requests/min")
		b.ReportMetric(float64(w0), "watches-at-start")
		b.Logf("at rest over %s: %d requests (%.1f a minute), %d of them new watches; %d watches opened at start", window, r1-r0, perMin, w1-w0, w0)
	}
}
