package pull_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/registry"
)

// A registry name that resolves nowhere is pulled through the mirror that
// containerd's certs.d directory names for it, on both registry
// implementations.
func TestPullThroughCertsDMirror(t *testing.T) {
	ctx := context.Background()
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"FROM_MIRROR=1"}})
			if err != nil {
				t.Fatal(err)
			}
			d, err := sandbox.PushImage(ctx, reg.Host+"/eng:1", img)
			if err != nil {
				t.Fatal(err)
			}
			digest := d.String()
			const name = "registry.gpupin.invalid"
			hostsDir := testenv.HostsToml(t, "", name, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", name, reg.Host))
			rt := testenv.Runtime(t, containerd.WithRegistry(registry.New(registry.Config{HostsDir: hostsDir})))
			if reg.InProcess != nil {
				reg.InProcess.Reset()
			}
			// The upstream name resolves nowhere: what is pulled came from
			// the mirror.
			p, err := rt.Pull(ctx, name+"/eng@"+digest, containerd.PullOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Digest != digest {
				t.Fatalf("pulled %s, want %s", p.Digest, digest)
			}
			if reg.InProcess != nil && reg.InProcess.Count("blob", "") == 0 {
				t.Fatal("the mirror served no blob")
			}
		})
	}
}

// A pull-only mirror (capabilities ["pull"]) serves content by digest and
// never answers for a tag: resolution goes to the upstream, the pull to
// the mirror. Shown on both registry implementations by what each holds:
// the mirror has the content but not the tag, the upstream has the tag but
// not the layers; only the split gets the engine resolved and pulled.
func TestPullOnlyMirror(t *testing.T) {
	ctx := context.Background()
	upstreams, mirrors := testenv.Registries(t), testenv.Registries(t)
	for i := range upstreams {
		up, mirror := upstreams[i], mirrors[i]
		t.Run(up.Name, func(t *testing.T) {
			// A layer of its own: containerd shares content between
			// namespaces, and a layer some other pull fetched would not be
			// fetched again.
			own, err := sandbox.RandomLayer(4096)
			if err != nil {
				t.Fatal(err)
			}
			v := testenv.CU129
			v.Layers = []v1.Layer{own}
			idx, err := sandbox.PublishEngine(ctx, up.Host, "demo", "1.0", []sandbox.EngineVariant{v})
			if err != nil {
				t.Fatal(err)
			}
			// The mirror gets the index and its children by digest: no tag.
			src, err := remote.Index(testenv.MustRef(t, up.Host+"/demo@"+idx.String()))
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.WriteIndex(testenv.MustRef(t, mirror.Host+"/demo@"+idx.String()), src); err != nil {
				t.Fatal(err)
			}
			im, err := src.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			child, err := src.Image(im.Manifests[0].Digest)
			if err != nil {
				t.Fatal(err)
			}
			layers, err := child.Layers()
			if err != nil {
				t.Fatal(err)
			}
			// The upstream loses the layers: a pull that reads them there fails.
			for _, l := range layers {
				ld, err := l.Digest()
				if err != nil {
					t.Fatal(err)
				}
				testenv.DeleteBlob(t, up.Host, "demo", ld.String())
			}

			const name = "registry.gpupin.invalid"
			server := fmt.Sprintf("server = \"http://%s\"\n", up.Host)
			withMirror := server + fmt.Sprintf("\n[host.\"http://%s\"]\n  capabilities = [\"pull\"]\n", mirror.Host)
			for _, reg := range []testenv.Reg{up, mirror} {
				if reg.InProcess != nil {
					reg.InProcess.Reset()
				}
			}
			policy := registry.New(registry.Config{HostsDir: testenv.HostsToml(t, "", name, withMirror)})
			set, err := (&images.Resolver{Remote: policy}).Resolve(ctx, name+"/demo:1.0")
			if err != nil {
				t.Fatalf("resolve (the mirror has no tag; the upstream must answer): %v", err)
			}
			if len(set.Variants) != 1 || !strings.HasPrefix(set.Variants[0].Ref, name+"/demo@") {
				t.Fatalf("variants %+v: want one, under the upstream name", set.Variants)
			}
			// The control, first (the pulls share the test's namespace and
			// so its content): without the mirror the same pull fails, so
			// the layers the pull below gets come from the mirror.
			rtUp := testenv.Runtime(t, containerd.WithRegistry(registry.New(registry.Config{HostsDir: testenv.HostsToml(t, "", name, server)})))
			if _, err := rtUp.Pull(ctx, set.Variants[0].Ref, containerd.PullOptions{}); err == nil {
				t.Fatal("pulled from an upstream without the layers")
			}
			if up.InProcess != nil {
				up.InProcess.Reset()
			}
			rt := testenv.Runtime(t, containerd.WithRegistry(policy))
			p, err := rt.Pull(ctx, set.Variants[0].Ref, containerd.PullOptions{})
			if err != nil {
				t.Fatalf("pull (the upstream has no layers; the mirror must serve them): %v", err)
			}
			if p.Digest != set.Variants[0].Digest {
				t.Fatalf("pulled %s, want %s", p.Digest, set.Variants[0].Digest)
			}
			if up.InProcess != nil {
				if n := up.InProcess.Count("blob", http.MethodGet); n != 0 {
					t.Errorf("the upstream served %d blob reads; the mirror should have", n)
				}
				for _, q := range mirror.InProcess.Requests() {
					if q.Kind() == "manifest" && strings.HasSuffix(q.Path, "/manifests/1.0") {
						t.Errorf("the pull-only mirror was asked for the tag: %s %s", q.Method, q.Path)
					}
				}
			}
		})
	}
}
