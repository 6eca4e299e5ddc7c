package provision_test

import (
	"context"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/provision"
)

// blobGETs counts the registry's GETs of one blob.
func blobGETs(reg *sandbox.Registry, d v1.Hash) int {
	n := 0
	for _, q := range reg.Requests() {
		if q.Method == "GET" && q.Kind() == "blob" && len(q.Path) > len(d.String()) && q.Path[len(q.Path)-len(d.String()):] == d.String() {
			n++
		}
	}
	return n
}

// With WithPrefetch, the fallback's layers are fetched while the first
// candidate is probed, once: its pull finds them, and nothing of the
// prefetch is left afterwards. Without a failure, the prefetch is let go.
func TestProvisionSimulatedPrefetchesTheFallback(t *testing.T) {
	ctx := context.Background()
	l13, err := sandbox.RandomLayer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	l129, err := sandbox.RandomLayer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	d129, _ := l129.Digest()

	bad := cu13
	bad.SimProbe, bad.Layers = "fail", []v1.Layer{l13}
	fallback := cu129
	fallback.Layers = []v1.Layer{l129}
	// atPull counts, when the fallback's pull begins, how often its layer
	// d was fetched already.
	atPull := func(reg **sandbox.Registry, n *int, d v1.Hash) provision.Option {
		*n = -1
		return provision.WithOnState(func(st provision.Status) {
			if st.State == provision.Pulling && st.Attempted == "cu129" && *n < 0 {
				*n = blobGETs(*reg, d)
			}
		})
	}
	t.Run("fallback", func(t *testing.T) {
		var reg *sandbox.Registry
		var before int
		e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{bad, fallback}, provision.WithPrefetch(1<<30), atPull(&reg, &before, d129))
		reg = e.reg
		e.reg.Reset()
		st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
		if st.State != provision.Ready || st.Variant != "cu129" {
			t.Fatalf("state %s variant %s: %s", st.State, st.Variant, st.Detail)
		}
		if before != 1 {
			t.Errorf("when the fallback's pull began its layer had been fetched %d times, want once (by the prefetch)", before)
		}
		if n := blobGETs(e.reg, d129); n != 1 {
			t.Errorf("the fallback's layer was fetched %d times, want once", n)
		}
		assertNoLeftovers(t, e.rt)
	})
	// The first candidate passes: the fallback's prefetch, if it began, is
	// let go, and the provision is as without it.
	t.Run("first-passes", func(t *testing.T) {
		e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{cu13, fallback}, provision.WithPrefetch(1<<30))
		st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
		if st.State != provision.Ready || st.Variant != "cu13" {
			t.Fatalf("state %s variant %s: %s", st.State, st.Variant, st.Detail)
		}
		assertNoLeftovers(t, e.rt)
	})
	// Too large to prefetch: the fallback is pulled after the failure, as
	// without the option.
	t.Run("too-large", func(t *testing.T) {
		// A layer of its own: one an earlier subtest stored is on the
		// daemon's disk, and linked, not fetched.
		l129, err := sandbox.RandomLayer(256 << 10)
		if err != nil {
			t.Fatal(err)
		}
		d129, _ := l129.Digest()
		fallback := cu129
		fallback.Layers = []v1.Layer{l129}
		var reg *sandbox.Registry
		var before int
		e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{bad, fallback}, provision.WithPrefetch(1), atPull(&reg, &before, d129))
		reg = e.reg
		e.reg.Reset()
		st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
		if st.State != provision.Ready || st.Variant != "cu129" {
			t.Fatalf("state %s variant %s: %s", st.State, st.Variant, st.Detail)
		}
		if before != 0 {
			t.Errorf("the fallback's layer was fetched %d times before its pull, over the bound", before)
		}
		// Pulled after the failure, once (on 2.x its blob is not stored: the
		// registry's count says it was fetched).
		if n := blobGETs(e.reg, d129); n != 1 {
			t.Errorf("the fallback's layer was fetched %d times, want once, by its pull", n)
		}
		assertNoLeftovers(t, e.rt)
	})
}
