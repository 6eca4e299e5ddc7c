package pull

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Progress is how far a pull has got.
type Progress struct {
	Ref        string
	Done       int64 // bytes of layers fetched
	Total      int64 // bytes of layers known so far
	Layers     int
	LayersDone int
	Finished   bool
}

// tracker follows a pull: the layers the handler saw, the content store's
// in-flight writes, and the downloads that bypass the store (direct.go).
type tracker struct {
	cs     content.Store
	ref    string
	report func(Progress)

	mu     sync.Mutex
	layers map[string]int64
	done   map[string]bool
	direct map[string]int64 // bytes of each layer downloaded without the store
}

func newTracker(cs content.Store, ref string, report func(Progress)) *tracker {
	return &tracker{cs: cs, ref: ref, report: report, layers: map[string]int64{}, done: map[string]bool{}, direct: map[string]int64{}}
}

func (t *tracker) observe(_ context.Context, d ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	if images.IsLayerType(d.MediaType) {
		t.mu.Lock()
		t.layers[d.Digest.String()] = d.Size
		t.mu.Unlock()
	}
	return nil, nil
}

// read counts n bytes of layer dg downloaded without the content store,
// before they are verified, as an ingest's offset counts them.
func (t *tracker) read(dg string, n int64) {
	t.mu.Lock()
	t.direct[dg] += n
	t.mu.Unlock()
}

// restart forgets what was counted of dg: it is downloaded again, into the
// store.
func (t *tracker) restart(dg string) {
	t.mu.Lock()
	delete(t.direct, dg)
	delete(t.done, dg)
	t.mu.Unlock()
}

func (t *tracker) start(ctx context.Context) func(ok bool) {
	if t.report == nil {
		return func(bool) {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				t.report(t.snapshot(ctx))
			}
		}
	}()
	return func(ok bool) {
		close(done)
		wg.Wait()
		p := t.snapshot(ctx)
		p.Finished = ok
		if ok {
			p.Done, p.LayersDone = p.Total, p.Layers
		}
		t.report(p)
	}
}

func (t *tracker) snapshot(ctx context.Context) Progress {
	active := map[string]int64{}
	if st, err := t.cs.ListStatuses(ctx); err == nil {
		for _, s := range st {
			active[ingestDigest(s)] = s.Offset
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := Progress{Ref: t.ref, Layers: len(t.layers)}
	for dg, size := range t.layers {
		p.Total += size
		if !t.done[dg] {
			if off, ok := active[dg]; ok {
				p.Done += off
				continue
			}
			if n, ok := t.direct[dg]; ok && n < size {
				p.Done += n
				continue
			} else if ok {
				t.done[dg] = true
			} else if _, err := t.cs.Info(ctx, digest.Digest(dg)); err == nil {
				t.done[dg] = true
			} else if !errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
		}
		if t.done[dg] {
			p.Done += size
			p.LayersDone++
		}
	}
	return p
}

// ingestDigest is the blob an in-flight write is for. containerd's local
// store does not report Expected, so without the ref ("layer-sha256:…",
// as remotes.MakeRefKey names it) a layer's bytes would count only once
// it is whole, and a slow pull would look stalled.
func ingestDigest(s content.Status) string {
	if s.Expected != "" {
		return s.Expected.String()
	}
	return s.Ref[strings.LastIndexAny(s.Ref, "-@")+1:]
}
