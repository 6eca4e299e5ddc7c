package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// nested is a publisher's trick: an index (demo:1.0) whose one entry is
// typed as an image manifest, annotated, but whose digest is another index
// (demo:inner) holding a real image. Resolution trusts the annotations and
// never fetches the entry; only the pull meets what the digest really is.
type nested struct {
	ref        string  // the outer index's tag
	inner      v1.Hash // the inner index, the entry's digest
	innerRaw   []byte
	image      v1.Hash // the image inside the inner index
	repository string  // host/demo
}

func publishNested(t *testing.T, reg *sandbox.Registry) nested {
	t.Helper()
	ctx := context.Background()
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.0"}})
	if err != nil {
		t.Fatal(err)
	}
	imgDigest, err := sandbox.PushImage(ctx, reg.Host+"/demo:inner-image", img)
	if err != nil {
		t.Fatal(err)
	}
	imgSize, _ := img.Size()
	amd64 := &v1.Platform{OS: "linux", Architecture: "amd64"}
	inner, _ := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType: types.OCIManifestSchema1, Digest: imgDigest, Size: imgSize, Platform: amd64,
	}}})
	if err := sandbox.PushRaw(ctx, reg.Host+"/demo:inner", types.OCIImageIndex, inner); err != nil {
		t.Fatal(err)
	}
	innerDigest, innerSize, _ := v1.SHA256(strings.NewReader(string(inner)))
	md := images.Metadata{Engine: "demo", EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Archs: "9.0", Probe: "cuda"}
	outer, _ := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType: types.OCIManifestSchema1, Digest: innerDigest, Size: innerSize, Annotations: md.Annotations(), Platform: amd64,
	}}})
	if err := sandbox.PushRaw(ctx, reg.Host+"/demo:1.0", types.OCIImageIndex, outer); err != nil {
		t.Fatal(err)
	}
	return nested{ref: reg.Host + "/demo:1.0", inner: innerDigest, innerRaw: inner, image: imgDigest, repository: reg.Host + "/demo"}
}

// An index where an image manifest was expected (and the reverse) is
// refused by containerd.Pull before anything is unpacked, when the caller
// says what it expects (PullOptions.MediaType); kinds, not spellings,
// must match (an OCI and a Docker image manifest are both images).
func TestFaultPullMediaTypeSimulated(t *testing.T) {
	const (
		ociImage    = string(types.OCIManifestSchema1)
		ociIndex    = string(types.OCIImageIndex)
		dockerImage = string(types.DockerManifestSchema2)
	)
	for _, tc := range []struct {
		name      string
		pull      func(n nested) string // the reference to pull
		mediaType string
		want      string // "" = the pull succeeds
	}{
		{"index-where-image-expected", func(n nested) string { return n.repository + "@" + n.inner.String() }, ociImage, "answered with an image index"},
		{"image-where-index-expected", func(n nested) string { return n.repository + "@" + n.image.String() }, ociIndex, "answered with an image manifest"},
		{"unknown-expected-type", func(n nested) string { return n.repository + "@" + n.image.String() }, "text/plain", "neither an image manifest nor an index"},
		{"image-as-docker-image", func(n nested) string { return n.repository + "@" + n.image.String() }, dockerImage, ""},
		{"index-as-index", func(n nested) string { return n.repository + "@" + n.inner.String() }, ociIndex, ""},
		{"unchecked", func(n nested) string { return n.repository + "@" + n.inner.String() }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			n := publishNested(t, reg)
			ref := tc.pull(n)
			reg.Reset()
			_, err := rt.Pull(ctx, ref, containerd.PullOptions{MediaType: tc.mediaType})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("pull: %v", err)
				}
				return
			}
			if !errors.Is(err, containerd.ErrMediaType) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v; want a refusal (ErrMediaType) saying %q", err, tc.want)
			}
			t.Logf("pull: %v", err)
			if n := reg.Count("blob", ""); n != 0 {
				t.Errorf("the refused pull fetched %d blobs", n)
			}
			if recs := gpupinRecords(t, rt); len(recs) != 0 {
				t.Errorf("records under gpupin labels: %v", recs)
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}

	// A record already there answers from its own target's type.
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	n := publishNested(t, reg)
	ref := n.repository + "@" + n.image.String()
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{MediaType: ociImage}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{MediaType: ociIndex}); !errors.Is(err, containerd.ErrMediaType) {
		t.Fatalf("pull of an existing image record expected as an index: %v; want ErrMediaType", err)
	}
}

// The same trick through provision: the entry's media type reaches the
// pull, the candidate fails at pull with the reason, and nothing is pinned.
// A registry whose Content-Type says image while the body is the index is
// refused by containerd's own check of the body.
func TestFaultIndexEntryIsAnIndexSimulated(t *testing.T) {
	for _, tc := range []struct {
		name string
		lie  bool // the registry answers the inner index as an image manifest
		want string
	}{
		{"entry-typed-image-is-an-index", false, "answered with an image index"},
		{"content-type-says-image", true, "expected manifest but found index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			n := publishNested(t, reg)
			if tc.lie {
				reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
					if !strings.HasSuffix(r.URL.Path, "/manifests/"+n.inner.String()) {
						return false
					}
					w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
					w.Header().Set("Docker-Content-Digest", n.inner.String())
					w.Header().Set("Content-Length", fmt.Sprint(len(n.innerRaw)))
					if r.Method == http.MethodGet {
						w.Write(n.innerRaw)
					}
					return true
				})
			}
			st := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0).Provision(ctx, provision.Want{Ref: n.ref})
			if st.State != provision.Failed || !strings.Contains(st.Detail, tc.want) {
				t.Fatalf("state %s: %s; want failed, about %q", st.State, st.Detail, tc.want)
			}
			if len(st.Attempts) != 1 || st.Attempts[0].Stage != "pull" {
				t.Errorf("attempts %+v; want one, failed at pull", st.Attempts)
			}
			t.Logf("provision: %s", st.Detail)
			if ps := pins(t, rt); len(ps) != 0 {
				t.Errorf("pinned: %+v", ps)
			}
			if recs := gpupinRecords(t, rt); len(recs) != 0 {
				t.Errorf("records under gpupin labels: %v", recs)
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}
