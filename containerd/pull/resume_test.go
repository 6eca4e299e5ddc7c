package pull_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// A pull cut mid-layer leaves a partial download in the content store,
// and the next pull resumes it with a range request (bytes=N-). A
// registry that refuses the range (go-containerregistry's answers 416 to
// an open one) must not fail that blob for ever: the partial is dropped
// and the blob downloaded from its start. One that honours it (Debian's
// docker-registry) resumes.
func TestPullAfterACutResumesOrStartsOver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool // answer 416 to a range, as go-containerregistry's registry does to an open one
	}{
		{"registry refuses the range", true},
		{"registry honours the range", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var host string
			var ranges atomic.Int32
			if tc.refuse {
				reg := testenv.Registry(t)
				reg.Hook = func(w http.ResponseWriter, r *http.Request) bool {
					if r.Header.Get("Range") == "" || !strings.Contains(r.URL.Path, "/blobs/") {
						return false
					}
					ranges.Add(1)
					http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"We don't understand your Range"}]}`, http.StatusRequestedRangeNotSatisfiable)
					return true
				}
				host = reg.Host
			} else {
				host = testenv.Distribution(t, sandbox.DistributionOptions{}).Host
			}
			layer, err := sandbox.RandomLayer(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			img, err := sandbox.Image(sandbox.ImageSpec{Layers: []v1.Layer{layer}})
			if err != nil {
				t.Fatal(err)
			}
			d, err := sandbox.PushImage(ctx, host+"/cut:1", img)
			if err != nil {
				t.Fatal(err)
			}
			ref := host + "/cut@" + d.String()
			rt := testenv.Runtime(t)
			desc, body := layerDesc(t, layer)
			nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
			cs := rt.Client().ContentStore()
			key := remotes.MakeRefKey(nsctx, desc)
			cw, err := content.OpenWriter(nsctx, cs, content.WithRef(key), content.WithDescriptor(desc))
			if err != nil {
				t.Fatal(err)
			}
			half := int64(len(body) / 2)
			if _, err := cw.Write(body[:half]); err != nil {
				t.Fatal(err)
			}
			cw.Close()
			if st, err := cs.Status(nsctx, key); err != nil || st.Offset != half {
				t.Fatalf("the cut download: %+v, %v; want %d bytes in", st, err, half)
			}
			if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatalf("pull after the cut: %v", err)
			}
			if tc.refuse && ranges.Load() == 0 {
				t.Error("the pull asked for no range: the cut download was not resumed")
			}
			if _, err := cs.Status(nsctx, key); !errdefs.IsNotFound(err) {
				t.Errorf("the partial download is still there after the pull: %v", err)
			}
			ra, err := cs.ReaderAt(nsctx, desc)
			if err != nil {
				t.Fatalf("the layer is not in the store after the pull: %v", err)
			}
			defer ra.Close()
			got, err := io.ReadAll(content.NewReader(ra))
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("the stored layer: %d bytes (%v), want the %d the registry has", len(got), err, len(body))
			}
		})
	}
}

func layerDesc(t *testing.T, l v1.Layer) (ocispec.Descriptor, []byte) {
	t.Helper()
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	body, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	mt, err := l.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	return ocispec.Descriptor{MediaType: string(mt), Digest: digest.FromBytes(body), Size: int64(len(body))}, body
}
