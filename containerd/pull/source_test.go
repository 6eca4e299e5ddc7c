package pull_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/typeurl/v2"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// Every blob gpupin stores is labelled with where it came from when its
// content-create event arrives, as a peer-to-peer mirror reads it there:
// containerd.io/distribution.source.<host>=<repo>, the reference asked
// for (not the staging name), under every unpacking strategy. A blob the
// store has already gets the second repository added to its label (a
// layer too, whose snapshot is there, except under containerd's own
// unpacker, which does not look at such a layer). Each stored blob has
// one create event, on every release: below 2.1 gpupin publishes it
// (pull.announcing), from 2.1 the daemon does, and gpupin then does not.
func TestBlobsCarryTheirSourceWhenCreated(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	host := reg.Host[:strings.LastIndex(reg.Host, ":")]
	key := labels.LabelDistributionSource + "." + host
	for _, mode := range []string{"", "keep", "containerd"} {
		t.Run("mode="+mode, func(t *testing.T) {
			rt := strategyRuntime(t, mode)
			nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
			img, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{
				layerOf(t, compression.GZip, file("a", 0o644, t.Name()+time.Now().String())),
				layerOf(t, compression.GZip, file("b", 0o644, t.Name()+time.Now().String())),
			}})
			if err != nil {
				t.Fatal(err)
			}
			refs := map[string]string{}
			for _, repo := range []string{"engine/one", "engine/two"} {
				dg, err := sandbox.PushImage(ctx, reg.Host+"/"+repo+":1", img)
				if err != nil {
					t.Fatal(err)
				}
				refs[repo] = reg.Host + "/" + repo + "@" + dg.String()
			}

			// The mirror's view: at each create event, the blob's labels.
			subCtx, cancel := context.WithCancel(nsctx)
			defer cancel()
			envs, errs := rt.Client().EventService().Subscribe(subCtx, `topic=="/content/create",namespace==`+rt.Namespace())
			var mu sync.Mutex
			seen := map[digest.Digest]string{}
			count := map[digest.Digest]int{}
			sizes := map[digest.Digest]int64{}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case env := <-envs:
						ev, err := typeurl.UnmarshalAny(env.Event)
						if err != nil {
							t.Errorf("event: %v", err)
							continue
						}
						cc, ok := ev.(*apievents.ContentCreate)
						if !ok {
							continue
						}
						info, err := rt.Client().ContentStore().Info(nsctx, digest.Digest(cc.Digest))
						mu.Lock()
						count[digest.Digest(cc.Digest)]++
						sizes[digest.Digest(cc.Digest)] = cc.Size
						if err != nil {
							seen[digest.Digest(cc.Digest)] = "info: " + err.Error()
						} else {
							seen[digest.Digest(cc.Digest)] = info.Labels[key]
						}
						mu.Unlock()
					case <-errs:
						return
					case <-subCtx.Done():
						return
					}
				}
			}()
			time.Sleep(100 * time.Millisecond) // the subscription is in place

			if _, err := rt.Pull(ctx, refs["engine/one"], containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			rec, err := rt.Client().ImageService().Get(nsctx, refs["engine/one"])
			if err != nil {
				t.Fatal(err)
			}
			blobs, err := images.Children(nsctx, rt.Client().ContentStore(), rec.Target)
			if err != nil {
				t.Fatal(err)
			}
			blobs = append(blobs, rec.Target)
			deadline := time.Now().Add(5 * time.Second)
			stored := 0
			for _, b := range blobs {
				if _, err := rt.Client().ContentStore().Info(nsctx, b.Digest); err != nil {
					continue // a layer extracted here and not stored
				}
				stored++
				for {
					mu.Lock()
					got, ok := seen[b.Digest]
					mu.Unlock()
					if ok || time.Now().After(deadline) {
						if got != "engine/one" {
							t.Errorf("%s %s: at its create event %s=%q (seen %v), want engine/one", b.MediaType, b.Digest, key, got, ok)
						}
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			if stored < 2 {
				t.Fatalf("only %d blobs of the image stored: the manifest and config at least should be", stored)
			}
			if mode != "" && stored != len(blobs) {
				t.Errorf("%d of %d blobs stored with layers kept", stored, len(blobs))
			}

			// The same blobs under a second repository: their label names both.
			if _, err := rt.Pull(ctx, refs["engine/two"], containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, b := range blobs {
				info, err := rt.Client().ContentStore().Info(nsctx, b.Digest)
				if err != nil {
					continue
				}
				if images.IsLayerType(b.MediaType) && mode == "containerd" {
					continue // containerd's unpacker fetches no layer whose snapshot is there
				}
				if got := info.Labels[key]; got != "engine/one,engine/two" {
					t.Errorf("%s %s: %s=%q after a pull from the second repository, want engine/one,engine/two", b.MediaType, b.Digest, key, got)
				}
			}
			// A second event would come at a commit, and the second pull
			// committed nothing: what has come by now is all there is.
			time.Sleep(200 * time.Millisecond)
			cancel()
			<-done
			for _, b := range blobs {
				if _, err := rt.Client().ContentStore().Info(nsctx, b.Digest); err != nil {
					continue
				}
				if n := count[b.Digest]; n != 1 {
					t.Errorf("%s %s: %d create events for two pulls, want 1", b.MediaType, b.Digest, n)
				}
				if got := sizes[b.Digest]; got != b.Size {
					t.Errorf("%s %s: its create event says %d bytes, want %d", b.MediaType, b.Digest, got, b.Size)
				}
			}
		})
	}
}
