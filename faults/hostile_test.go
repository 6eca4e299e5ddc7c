package faults

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// A registry that lies or floods: every lie is refused with an error that
// names it, and nothing is stored under a gpupin name (no record with
// gpupin labels, no pin).
func TestFaultHostileRegistrySimulated(t *testing.T) {
	cases := []struct {
		name string
		// setup publishes under reg and returns the ref to provision.
		setup func(t *testing.T, reg *sandbox.Registry) string
		// want is in the Resolve error (resolve) or the provision's detail.
		want    string
		resolve bool // Resolve itself refuses
		check   func(t *testing.T)
	}{
		{name: "blob-digest-lie", want: "digest", setup: func(t *testing.T, reg *sandbox.Registry) string {
			l, err := sandbox.RandomLayer(256 << 10)
			if err != nil {
				t.Fatal(err)
			}
			v := cu129
			v.Layers = []v1.Layer{l}
			ref := publish(t, reg, "demo", v)
			dg, _ := l.Digest()
			size, _ := l.Size()
			// Same length, other bytes: only the digest can tell.
			reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+dg.String()) {
					return false
				}
				junk := make([]byte, size)
				rand.Read(junk)
				w.Header().Set("Content-Length", fmt.Sprint(size))
				w.Write(junk)
				return true
			})
			return ref
		}},
		{name: "blob-size-lie", want: "size", setup: func(t *testing.T, reg *sandbox.Registry) string {
			l, err := sandbox.RandomLayer(256 << 10)
			if err != nil {
				t.Fatal(err)
			}
			// The manifest says the layer is 100 bytes shorter than it is.
			return publishEdited(t, reg, []v1.Layer{l}, func(m *v1.Manifest) { m.Layers[1].Size -= 100 })
		}},
		{name: "index-refers-to-itself", resolve: true, want: "nested indexes", setup: func(t *testing.T, reg *sandbox.Registry) string {
			// No index can hold its own sha256, so the lie is the registry's:
			// it answers the entry's digest with the index itself.
			return serveIndexAsItsOwnEntry(t, reg, types.OCIImageIndex)
		}},
		{name: "index-entry-is-the-index", resolve: true, want: "digest", setup: func(t *testing.T, reg *sandbox.Registry) string {
			// The same, with the entry typed as an image and no annotations,
			// so the resolver fetches it and gets the index back.
			return serveIndexAsItsOwnEntry(t, reg, types.OCIManifestSchema1)
		}},
		{name: "manifest-100MiB-with-length", resolve: true, want: "limit", setup: func(t *testing.T, reg *sandbox.Registry) string {
			return floodManifest(t, reg, true)
		}},
		{name: "manifest-100MiB-chunked", resolve: true, want: "limit", setup: func(t *testing.T, reg *sandbox.Registry) string {
			return floodManifest(t, reg, false)
		}},
		{name: "annotation-control-characters", resolve: true, want: "control character", setup: func(t *testing.T, reg *sandbox.Registry) string {
			img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.0"}})
			if err != nil {
				t.Fatal(err)
			}
			md := images.Metadata{Engine: "demo", EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Archs: "9.0", Probe: "cuda"}
			ann := md.Annotations()
			ann[images.AnnotationVariant] = "cu129\x1b[2J\rPINNED"
			ref := reg.Host + "/demo:1.0"
			if _, err := sandbox.PushIndex(context.Background(), ref, []sandbox.IndexEntry{{Image: img, Annotations: ann, Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}}); err != nil {
				t.Fatal(err)
			}
			return ref
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			ref := tc.setup(t, reg)
			if tc.resolve {
				_, err := (&images.Resolver{}).Resolve(ctx, ref)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Resolve: %v; want an error about %q", err, tc.want)
				}
				t.Logf("Resolve: %v", err)
			}
			st := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0).Provision(ctx, provision.Want{Ref: ref})
			if st.State != provision.Failed || !strings.Contains(st.Detail, tc.want) {
				t.Fatalf("state %s: %s; want failed, about %q", st.State, st.Detail, tc.want)
			}
			t.Logf("provision: %s", st.Detail)
			if recs := gpupinRecords(t, rt); len(recs) != 0 {
				t.Errorf("records under gpupin labels: %v", recs)
			}
			if ps := pins(t, rt); len(ps) != 0 {
				t.Errorf("pins: %+v", ps)
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// publishEdited pushes an image with its manifest edited, and an annotated
// index of it under demo:1.0 (so the resolver trusts the index and the lie
// reaches the pull).
func publishEdited(t *testing.T, reg *sandbox.Registry, layers []v1.Layer, edit func(*v1.Manifest)) string {
	t.Helper()
	ctx := context.Background()
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.0"}, Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.PushImage(ctx, reg.Host+"/demo:honest", img); err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	edit(m)
	raw, _ := json.Marshal(m)
	if err := sandbox.PushRaw(ctx, reg.Host+"/demo:edited", types.OCIManifestSchema1, raw); err != nil {
		t.Fatal(err)
	}
	dg, size, _ := v1.SHA256(strings.NewReader(string(raw)))
	md := images.Metadata{Engine: "demo", EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Archs: "9.0", Probe: "cuda"}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType: types.OCIManifestSchema1, Digest: dg, Size: size, Annotations: md.Annotations(),
		Platform: &v1.Platform{OS: "linux", Architecture: "amd64"},
	}}}
	rawIdx, _ := json.Marshal(idx)
	if err := sandbox.PushRaw(ctx, reg.Host+"/demo:1.0", types.OCIImageIndex, rawIdx); err != nil {
		t.Fatal(err)
	}
	return reg.Host + "/demo:1.0"
}

func serveIndexAsItsOwnEntry(t *testing.T, reg *sandbox.Registry, entryType types.MediaType) string {
	t.Helper()
	self := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType: entryType, Digest: self, Size: 512, Platform: &v1.Platform{OS: "linux", Architecture: "amd64"},
	}}}
	raw, _ := json.Marshal(idx)
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v2/demo/manifests/") {
			return false
		}
		w.Header().Set("Content-Type", string(types.OCIImageIndex))
		w.Header().Set("Content-Length", fmt.Sprint(len(raw)))
		if r.Method == http.MethodGet {
			w.Write(raw)
		}
		return true
	})
	return reg.Host + "/demo:1.0"
}

// floodManifest answers the tag with 100 MiB of JSON, streamed (never held
// in memory), with or without a Content-Length; it checks at cleanup that
// gpupin stopped reading long before the end.
func floodManifest(t *testing.T, reg *sandbox.Registry, withLength bool) string {
	t.Helper()
	const total = 100 << 20
	var written atomic.Int64
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v2/demo/manifests/") {
			return false
		}
		w.Header().Set("Content-Type", string(types.OCIImageIndex))
		if withLength {
			w.Header().Set("Content-Length", fmt.Sprint(total))
		}
		if r.Method != http.MethodGet {
			return true
		}
		chunk := []byte(`{"schemaVersion":2,"manifests":[` + strings.Repeat(" ", 64<<10-32))
		pad := []byte(strings.Repeat(" ", 64<<10))
		for n := 0; n < total; {
			b := pad
			if n == 0 {
				b = chunk
			}
			m, err := w.Write(b)
			n += m
			written.Add(int64(m))
			if err != nil {
				break // the client hung up: what we want
			}
		}
		return true
	})
	t.Cleanup(func() {
		if n := written.Load(); n >= total/2 {
			t.Errorf("the registry got to write %d of its %d bytes: gpupin kept reading", n, total)
		}
	})
	return reg.Host + "/demo:1.0"
}
