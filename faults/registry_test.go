package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// The registry dies in the middle of a layer: the provision fails with the
// reason, the pin proved earlier stays as it was, and the next attempt
// completes without fetching again the layers that had arrived. Where
// layers are stored (--keep-layers) the half of the cut
// layer that had arrived is not fetched again either; where a layer
// extracted here is not stored, what stays is the snapshots committed
// before the cut, and the cut layer comes again whole, into the store: a
// retry stores what it downloads.
func TestFaultRegistryDiesMidPullSimulated(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep-layers=%v", keep), func(t *testing.T) { registryDiesMidPull(t, keep) })
	}
}

func registryDiesMidPull(t *testing.T, keep bool) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t, containerd.WithKeepLayers(keep))
	stored := keep // a layer extracted here in parallel is not stored
	nodes := testenv.NewNode(h100("580.82.07"))
	p := newProvisioner(t, rt, nodes, 0)

	ref := publish(t, reg, "demo", cu129)
	mustReady(t, p.Provision(ctx, provision.Want{Ref: ref}))
	before := pins(t, rt)

	// A new build under the same tag, and a driver upgrade: the pin no
	// longer answers for this node, so the next provision pulls.
	var layers []v1.Layer
	for i := 0; i < 4; i++ {
		l, err := sandbox.RandomLayer(2 << 20)
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	v := cu129
	v.Layers = layers
	publish(t, reg, "demo", v)
	nodes.Set(h100("580.95.05"))

	victim := layers[len(layers)-1]
	victimDigest, _ := victim.Digest()
	victimSize, _ := victim.Size()
	var complete, completeDiffs []v1.Hash
	for _, l := range layers[:len(layers)-1] {
		d, _ := l.Digest()
		complete = append(complete, d)
		dd, _ := l.DiffID()
		completeDiffs = append(completeDiffs, dd)
	}
	cs := rt.Client().ContentStore()
	sn := rt.Client().SnapshotService("overlayfs")
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+victimDigest.String()) {
			return false
		}
		rc, err := victim.Compressed()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return true
		}
		defer rc.Close()
		w.Header().Set("Content-Length", fmt.Sprint(victimSize))
		w.WriteHeader(http.StatusOK)
		io.CopyN(w, rc, victimSize/2)
		w.(http.Flusher).Flush()
		// Let the other layers land first, so there is something to reuse.
		if stored {
			waitFor(t, "the other layers in the content store", func() bool {
				for _, d := range complete {
					if _, err := cs.Info(testenv.Context(rt), digest.Digest(d.String())); err != nil {
						return false
					}
				}
				return true
			})
		} else {
			waitFor(t, "the other layers' snapshots committed", func() bool {
				done := map[string]bool{}
				sn.Walk(testenv.Context(rt), func(_ context.Context, i snapshots.Info) error {
					if i.Kind == snapshots.KindCommitted {
						done[i.Labels[snapshots.LabelSnapshotDiffID]] = true
					}
					return nil
				})
				for _, d := range completeDiffs {
					if !done[d.String()] {
						return false
					}
				}
				return true
			})
		}
		reg.SetDown(true)
		panic(http.ErrAbortHandler) // the connection drops mid-body
	})

	st := p.Provision(ctx, provision.Want{Ref: ref})
	if st.State != provision.Failed {
		t.Fatalf("state %s, want failed: %s", st.State, st.Detail)
	}
	if len(st.Attempts) != 1 || st.Attempts[0].Stage != "pull" || !strings.Contains(st.Detail, "failed at pull") ||
		!strings.Contains(st.Detail, "the earlier pin "+before[0].Ref+" (cu129) is unchanged") {
		t.Fatalf("the reason does not say what failed and what was kept: %s (%+v)", st.Detail, st.Attempts)
	}
	samePins(t, rt, before)
	if recs := gpupinRecords(t, rt); len(recs) != 1 || recs[0] != before[0].Ref {
		t.Fatalf("records under gpupin labels after the failed pull: %v", recs)
	}

	// The registry is back.
	reg.SetHook(nil)
	reg.SetDown(false)
	reg.Reset()
	st = p.Provision(ctx, provision.Want{Ref: ref})
	mustReady(t, st)
	if st.Pinned == before[0].Ref {
		t.Fatalf("the new build was not pinned: %s", st.Detail)
	}
	for _, d := range complete {
		if n := countBlobGets(reg, d); n != 0 {
			t.Errorf("layer %s had arrived before the registry died, yet was fetched %d more times", d, n)
		}
	}
	t.Logf("second attempt (layers stored: %v): %d requests, %d blob bytes (the cut layer is %d bytes)", stored, len(reg.Requests()), reg.BytesServed("blob", "GET"), victimSize)
	switch got := reg.BytesServed("blob", "GET"); {
	case stored && got >= victimSize:
		t.Errorf("second attempt fetched %d blob bytes; the half of the cut layer that had arrived (%d bytes) was fetched again", got, victimSize/2)
	case !stored && got != victimSize:
		t.Errorf("second attempt fetched %d blob bytes; want the cut layer whole (%d bytes), and nothing else", got, victimSize)
	}
	// A retry stores what it downloads, so that a third attempt would
	// resume where a second cut fell.
	if _, err := cs.Info(testenv.Context(rt), digest.Digest(victimDigest.String())); err != nil {
		t.Errorf("the retry did not store the cut layer: %v", err)
	}
	if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

func countBlobGets(reg *sandbox.Registry, d v1.Hash) int {
	n := 0
	for _, q := range reg.Requests() {
		if q.Method == http.MethodGet && strings.HasSuffix(q.Path, "/blobs/"+d.String()) {
			n++
		}
	}
	return n
}

// stallBlob answers a GET of one blob with half its body, says so on
// reached, and holds the connection until release.
func stallBlob(digest string, reached chan<- struct{}, release <-chan struct{}) func(http.ResponseWriter, *http.Request) bool {
	var once sync.Once
	return func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+digest) {
			return false
		}
		w.Header().Set("Content-Length", "1048576")
		w.WriteHeader(http.StatusOK)
		w.Write(make([]byte, 4096))
		w.(http.Flusher).Flush()
		once.Do(func() { close(reached) })
		select {
		case <-release:
		case <-r.Context().Done():
		}
		panic(http.ErrAbortHandler)
	}
}
