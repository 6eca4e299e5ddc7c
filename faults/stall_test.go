package faults

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/runtime"
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
	rt := testenv.Runtime(t, runtime.WithRegistry(policy))
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
	p := provision.New(rt, provision.WithNode(testenv.NewNode(h100("580.82.07"))), provision.WithOverrides(provision.NoOverrides()),
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
	rt := testenv.Runtime(t, runtime.WithRegistry(policy))
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
