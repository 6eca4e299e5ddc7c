package faults

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// A layer trickled a byte a second: the status says the pull stalled
// while it does, the provision fails saying so, and the pin is unchanged.
func TestFaultLayerTrickledSimulated(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	l, err := sandbox.RandomLayer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	dg, _ := l.Digest()
	layer := dg.String()
	v := cu129
	v.Layers = []v1.Layer{l}
	ref := publish(t, reg, "demo", v)
	policy := registry.New(registry.Config{StallTimeout: 8 * time.Second})
	rt := testenv.Runtime(t, containerd.WithRegistry(policy))
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+layer) {
			return false
		}
		w.Header().Set("Content-Length", "1048576")
		w.WriteHeader(http.StatusOK)
		for i := 0; i < 60; i++ {
			if _, err := w.Write([]byte{0}); err != nil {
				return true
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return true
			case <-time.After(time.Second):
			}
		}
		return true
	})
	var mu sync.Mutex
	var seen []string
	p := testenv.Provisioner(t, rt, provision.WithNode(testenv.NewNode(h100("580.82.07"))), provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(t.TempDir()), provision.WithProbeDir(t.TempDir()),
		provision.WithOnState(func(st provision.Status) { mu.Lock(); seen = append(seen, st.Detail); mu.Unlock() }))
	start := time.Now()
	st := p.Provision(ctx, provision.Want{Ref: ref})
	took := time.Since(start)
	if st.State != provision.Failed || !strings.Contains(st.Detail, "stalled") {
		t.Fatalf("%s; want a failure that says it stalled", st)
	}
	if took > 40*time.Second {
		t.Errorf("a stall of 8s took %s to end", took)
	}
	mu.Lock()
	defer mu.Unlock()
	shown := false
	for _, d := range seen {
		shown = shown || strings.Contains(d, "(stalled ")
	}
	if !shown {
		t.Errorf("no status said the pull stalled: %q", seen)
	}
	t.Logf("failed after %s: %s", took.Round(time.Second), st.Detail)
}

// A pull's status judges a stall by the registry policy's StallBytes, not
// a fixed 32 KiB: a layer served at 512 KiB/s (containerd writes what it
// fetched in 1 MiB pieces, so the status sees a 1 MiB step every 2 s) is
// moving by the default rule, and stalled under a policy that asks for
// 5 MiB (which cuts nothing here: its window is 30 s).
func TestFaultPullStatusFollowsThePolicysStallRuleSimulated(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stallBytes  int64 // 0: the default
		wantStalled bool
	}{
		{"default rule", 0, false},
		{"5 MiB asked", 5 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := testenv.Registry(t)
			l, err := sandbox.RandomLayer(3 << 20)
			if err != nil {
				t.Fatal(err)
			}
			dg, _ := l.Digest()
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			blob, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			v := cu129
			v.Layers = []v1.Layer{l}
			ref := publish(t, reg, "demo", v)
			reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+dg.String()) {
					return false
				}
				w.Header().Set("Content-Length", strconv.Itoa(len(blob)))
				w.WriteHeader(http.StatusOK)
				for rest := blob; len(rest) > 0; {
					n := min(128<<10, len(rest))
					if _, err := w.Write(rest[:n]); err != nil {
						return true
					}
					rest = rest[n:]
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						return true
					case <-time.After(250 * time.Millisecond):
					}
				}
				return true
			})
			policy := registry.New(registry.Config{StallTimeout: 30 * time.Second, StallBytes: tc.stallBytes})
			rt := testenv.Runtime(t, containerd.WithRegistry(policy))
			var mu sync.Mutex
			var seen []string
			p := testenv.Provisioner(t, rt, provision.WithNode(testenv.NewNode(h100("580.82.07"))), provision.WithOverrides(provision.NoOverrides()),
				provision.WithLockDir(t.TempDir()), provision.WithProbeDir(t.TempDir()),
				provision.WithOnState(func(st provision.Status) { mu.Lock(); seen = append(seen, st.Detail); mu.Unlock() }))
			st := p.Provision(ctx, provision.Want{Ref: ref})
			mustReady(t, st)
			mu.Lock()
			defer mu.Unlock()
			stalled := false
			for _, d := range seen {
				stalled = stalled || strings.Contains(d, "(stalled ")
			}
			if stalled != tc.wantStalled {
				t.Fatalf("a status said stalled: %v, want %v: %q", stalled, tc.wantStalled, seen)
			}
		})
	}
}

// Registries that never answer do not starve other engines: with two
// provisions at a time and two engines stuck, the third still gets its
// turn and is ready, and the stuck ones fail saying the registry did not
// answer.
func TestFaultStuckRegistriesDoNotStarveOthersSimulated(t *testing.T) {
	ctx := context.Background()
	good := testenv.Registry(t)
	stuck := testenv.Registry(t)
	goodRef := publish(t, good, "demo", cu129)
	a := publish(t, stuck, "a", cu129)
	b := publish(t, stuck, "b", cu129)
	stuck.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return true
	})
	policy := registry.New(registry.Config{HeaderTimeout: 2 * time.Second})
	rt := testenv.Runtime(t, containerd.WithRegistry(policy))
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0)
	start := time.Now()
	sts := p.Converge(ctx, []provision.Want{{Ref: a}, {Ref: b}, {Ref: goodRef}})
	t.Logf("converged in %s", time.Since(start).Round(100*time.Millisecond))
	for _, st := range sts[:2] {
		if st.State != provision.Failed || !strings.Contains(st.Detail, "no answer in 2s") {
			t.Errorf("stuck engine: %s", st)
		}
	}
	mustReady(t, sts[2])
}

// The agent's loop with two provision slots and two engines stuck on a
// registry that never answers (one at its manifest, one mid-layer): the
// third engine still gets a slot and is ready, and while they are stuck
// their statuses say what they wait for (resolving, pulling … (stalled
// N s)), never pending.
func TestFaultStuckRegistriesDoNotStarveTheLoopSimulated(t *testing.T) {
	good := testenv.Registry(t)
	stuck := testenv.Registry(t)
	goodRef := publish(t, good, "demo", cu129)
	l, err := sandbox.RandomLayer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	dg, _ := l.Digest()
	v := cu129
	v.Layers = []v1.Layer{l}
	a := publish(t, stuck, "a", cu129)
	b := publish(t, stuck, "b", v)
	stuck.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case strings.HasPrefix(r.URL.Path, "/v2/a/manifests/"):
			<-r.Context().Done() // no headers, ever
			return true
		case strings.HasSuffix(r.URL.Path, "/v2/b/blobs/"+dg.String()) && r.Method == http.MethodGet:
			w.Header().Set("Content-Length", "262144")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // headers, then silence
			return true
		}
		return false
	})
	policy := registry.New(registry.Config{HeaderTimeout: 10 * time.Second, StallTimeout: 14 * time.Second})
	rt := testenv.Runtime(t, containerd.WithRegistry(policy))
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0)
	loop := provision.NewLoop(p, provision.LoopOptions{Parallel: 2, NoSweep: true})
	if err := loop.SetWants([]provision.Want{{Ref: a}, {Ref: b}, {Ref: goodRef}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); loop.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()

	// While both slots are held by the stuck engines.
	var resolving, stalled bool
	waitFor(t, "the stuck engines to say what they wait for", func() bool {
		sts := loop.Status()
		if loop.InFlight() == 2 && sts[2].State == provision.Pending {
			for _, st := range sts[:2] {
				// Pending only for the moment between its start and the
				// provision's first word, and saying so.
				if st.State == provision.Pending && !strings.HasPrefix(st.Detail, "started") {
					t.Fatalf("a running engine shows pending: %s", st)
				}
			}
			resolving = resolving || (sts[0].State == provision.Resolving && strings.HasPrefix(sts[0].Detail, "resolving "+a))
			stalled = stalled || (sts[1].State == provision.Pulling && strings.Contains(sts[1].Detail, "(stalled 5s)"))
		}
		return resolving && stalled
	})
	start := time.Now()
	waitFor(t, "the third engine to be ready", func() bool { return loop.Status()[2].State == provision.Ready })
	t.Logf("third engine ready %s after the stuck ones were seen", time.Since(start).Round(100*time.Millisecond))
	waitFor(t, "the stuck engines to fail", func() bool {
		sts := loop.Status()
		return sts[0].State == provision.Failed && sts[1].State == provision.Failed
	})
	sts := loop.Status()
	if !strings.Contains(sts[0].Detail, "no answer in 10s") {
		t.Errorf("manifest never answered: %s", sts[0])
	}
	if !strings.Contains(sts[1].Detail, "stalled") {
		t.Errorf("layer stalled: %s", sts[1])
	}
}
