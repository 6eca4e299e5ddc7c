package fetchgate_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpupin/gpupin/fetchgate"
	"github.com/gpupin/gpupin/internal/kubetest"
)

// Layer-by-layer release against a real kube-apiserver: the holder lists
// each layer as it is stored; the others' pulls fetch each once listed.

func layerDigest(i int) string { return fmt.Sprintf("sha256:%064x", i) }

// store is one node's content store as its gate's WithStored sees it: the
// image's n layers, and when each was stored.
type store struct {
	n  int
	mu sync.Mutex
	at map[string]time.Time
}

func newStore(n int) *store { return &store{n: n, at: map[string]time.Time{}} }

func (s *store) option() fetchgate.Option {
	return fetchgate.WithStored(func(context.Context, string) ([]string, bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var l []string
		for i := range s.n {
			if _, ok := s.at[layerDigest(i)]; ok {
				l = append(l, layerDigest(i))
			}
		}
		return l, len(l) == s.n
	})
}

func (s *store) storedAt(i int) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at[layerDigest(i)]
}

// layered pulls n layers of size bytes into s, one a tick, each once await
// lets it go; after stopAfter layers (if below n) it moves nothing more
// until ctx ends.
func layered(n int, size int64, tick time.Duration, s *store, stopAfter int) fetchgate.Pull {
	return func(ctx context.Context, progress func(int64, int64), await fetchgate.Await) error {
		progress(0, int64(n)*size)
		for i := range n {
			if i == stopAfter {
				<-ctx.Done()
				return ctx.Err()
			}
			if await != nil {
				if err := await(ctx, layerDigest(i)); err != nil {
					return err
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(tick):
			}
			s.mu.Lock()
			s.at[layerDigest(i)] = time.Now()
			s.mu.Unlock()
			progress(int64(i+1)*size, int64(n)*size)
		}
		return nil
	}
}

// TestFollowersFetchEachLayerOnceListed: three nodes follow a holder's
// pull: each fetches every layer only after the holder stored it, and the
// first before the holder's pull ended (their pulls overlap its).
func TestFollowersFetchEachLayerOnceListed(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	_, ref := digestFor(t)
	const n = 8
	stores := map[string]*store{}
	rec := newRecord()
	var wg sync.WaitGroup
	for i := range 4 {
		node := "n" + strconv.Itoa(i+1)
		st := newStore(n)
		stores[node] = st
		g := gate(t, c, node, st.option(), fetchgate.WithLeaseDuration(3*time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if node != "n1" {
				// n1 first: it holds.
				time.Sleep(500 * time.Millisecond)
			}
			if err := g.Fetch(context.Background(), ref, rec.note(node), rec.pull(node, layered(n, 1<<20, 300*time.Millisecond, st, n))); err != nil {
				t.Errorf("%s: %v", node, err)
			}
		}()
	}
	wg.Wait()
	holder := stores["n1"]
	if f := rec.notes["n1"]; len(f) == 0 || !strings.Contains(f[0], "from upstream for the fleet") {
		t.Fatalf("n1 did not hold: notes %q", rec.notes)
	}
	for node, st := range stores {
		if node == "n1" {
			continue
		}
		if n := rec.notes[node]; len(n) == 0 || !strings.HasPrefix(n[0], "pulling through the mirror: as n1 fetches") {
			t.Errorf("%s: notes %q", node, n)
		}
		for i := range n {
			if at := st.storedAt(i); at.IsZero() || !at.After(holder.storedAt(i)) {
				t.Errorf("%s: layer %d stored at %s, the holder's at %s: fetched before a peer had it", node, i, at.Format(time.StampMilli), holder.storedAt(i).Format(time.StampMilli))
			}
		}
		if first, last := st.storedAt(0), holder.storedAt(n-1); !first.Before(last) {
			t.Errorf("%s: its first layer at %s, the holder's last at %s: it waited for the whole image", node, first.Format(time.StampMilli), last.Format(time.StampMilli))
		}
	}
	t.Logf("holder's last layer %s; followers' last: n2 %s, n3 %s, n4 %s", holder.storedAt(n-1).Format(time.StampMilli),
		stores["n2"].storedAt(n-1).Format(time.StampMilli), stores["n3"].storedAt(n-1).Format(time.StampMilli), stores["n4"].storedAt(n-1).Format(time.StampMilli))
}

// helperLayers is the killed holder's image in TestFollowerTakesOverMidPull.
const helperLayers = 8

// TestFollowerTakesOverMidPull: the holder (a process of its own) lists 3
// of 8 layers and is killed. Of three nodes whose pulls follow it, one
// takes the lease over within its duration and fetches the rest; the
// other two follow it: each of their later layers comes after the new
// holder stored it. Every pull ends.
func TestFollowerTakesOverMidPull(t *testing.T) {
	c := kubetest.StartT(t, manifests, users()...)
	dg, ref := digestFor(t)
	const listed = 3
	cmd, out := startHelper(t, c, ref, "FETCHGATE_HELPER_LAYERS="+strconv.Itoa(listed))
	// n1 holds before the followers ask.
	leases := nodeClient(t, c, "n0").CoordinationV1().Leases(ns)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		l, err := leases.Get(context.Background(), fetchgate.LeaseName(dg, 0), metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "n1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the helper never held the lease: %v\n%s", err, out)
		}
	}
	stores := map[string]*store{}
	rec := newRecord()
	var wg sync.WaitGroup
	for _, node := range []string{"n2", "n3", "n4"} {
		st := newStore(helperLayers)
		stores[node] = st
		g := gate(t, c, node, st.option(), fetchgate.WithLeaseDuration(3*time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Fetch(context.Background(), ref, rec.note(node), rec.pull(node, layered(helperLayers, 1<<20, 100*time.Millisecond, st, helperLayers))); err != nil {
				t.Errorf("%s: %v", node, err)
			}
		}()
	}
	// The followers have the listed layers: the holder is mid-pull.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, st := range stores {
			ok = ok && !st.storedAt(listed-1).IsZero()
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the followers never had the holder's %d layers: notes %q\n%s", listed, rec.notes, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Kill()
	killedAt := time.Now()
	cmd.Wait()
	wg.Wait()
	var taker string
	for node := range stores {
		for _, s := range rec.notes[node] {
			if strings.Contains(s, "took over lease") {
				if taker != "" {
					t.Errorf("%s and %s both took over", taker, node)
				}
				taker = node
			}
		}
	}
	if taker == "" {
		t.Fatalf("nobody took over: notes %q", rec.notes)
	}
	took := stores[taker].storedAt(listed).Sub(killedAt)
	if bound := 3*time.Second + time.Second + 2*time.Second; took > bound {
		t.Errorf("%s fetched the next layer %s after the kill, bound %s", taker, took, bound)
	}
	for node, st := range stores {
		for i := range helperLayers {
			if st.storedAt(i).IsZero() {
				t.Errorf("%s: layer %d never stored", node, i)
			}
		}
		if node == taker {
			continue
		}
		for i := listed; i < helperLayers; i++ {
			if at, by := st.storedAt(i), stores[taker].storedAt(i); !at.After(by) {
				t.Errorf("%s: layer %d at %s, before %s had it (%s): it went upstream too", node, i, at.Format(time.StampMilli), taker, by.Format(time.StampMilli))
			}
		}
	}
	t.Logf("%s took over; its next layer %s after the kill (lease 3s)", taker, took.Round(time.Millisecond))
}
