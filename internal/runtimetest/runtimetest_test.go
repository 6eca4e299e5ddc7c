package runtimetest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/internal/runtimetest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The stand-in the fast tier runs on: no daemon, under -short too.
func TestConformanceInMemory(t *testing.T) {
	runtimetest.Conformance(t, func(t *testing.T) runtimetest.Harness {
		m := memrt.New()
		var refs [2]string
		for i, d := range []string{"a", "b"} {
			ref := "registry.test/eng@sha256:" + strings.Repeat(d, 64)
			if _, err := m.Pull(context.Background(), ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			refs[i] = ref
		}
		return runtimetest.Harness{Runtime: m, Images: refs,
			Has:          func(_ *testing.T, name string) bool { return m.Has(name) },
			DeleteRecord: func(_ *testing.T, name string) { m.DeleteRecord(name) },
			Relabel:      func(_ *testing.T, name string) { m.Relabel(name) },
			LoseImage:    func(_ *testing.T, name string) { m.LoseImage(name) },
		}
	})
}

// The real pin store on the package's containerd (Debian's 1.6, or
// $GPUPIN_TEST_CONTAINERD), over images pulled from a loopback registry.
func TestConformanceOverContainerd(t *testing.T) {
	t.Logf("containerd %s", testenv.Containerd(t).Version)
	reg := testenv.Registry(t)
	var pushed [2]string
	for i, env := range []string{"VARIANT=cu13", "VARIANT=cu129"} {
		img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{env}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := sandbox.PushImage(context.Background(), reg.Host+"/eng:1", img)
		if err != nil {
			t.Fatal(err)
		}
		pushed[i] = reg.Host + "/eng@" + d.String()
	}
	runtimetest.Conformance(t, func(t *testing.T) runtimetest.Harness {
		rt := testenv.Runtime(t)
		for _, ref := range pushed {
			if _, err := rt.Pull(context.Background(), ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		ctx := testenv.Context(rt)
		is := rt.Client().ImageService()
		del := func(t *testing.T, name string) images.Image {
			t.Helper()
			rec, err := is.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			// Synchronous: what nothing holds is collected before the
			// next step looks.
			if err := is.Delete(ctx, name, images.SynchronousDelete()); err != nil {
				t.Fatal(err)
			}
			return rec
		}
		return runtimetest.Harness{Runtime: rt, Images: pushed,
			Has: func(t *testing.T, name string) bool {
				t.Helper()
				_, err := is.Get(ctx, name)
				if err != nil && !errdefs.IsNotFound(err) {
					t.Fatal(err)
				}
				return err == nil
			},
			DeleteRecord: func(t *testing.T, name string) { del(t, name) },
			Relabel: func(t *testing.T, name string) {
				rec, err := is.Get(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				// The labels a CRI pull leaves, every other one gone.
				rec.Labels = map[string]string{"io.cri-containerd.image": "managed"}
				if _, err := is.Update(ctx, rec); err != nil {
					t.Fatal(err)
				}
			},
			LoseImage: func(t *testing.T, name string) {
				rec := del(t, name)
				// The manifest the pin's lease held goes too.
				if err := rt.Client().ContentStore().Delete(ctx, digest.Digest(rec.Target.Digest)); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
