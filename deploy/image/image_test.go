// Package image_test builds gpupin's own container image as `make image`
// does and runs it in containerd.
package image_test

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// filesOf lists the regular files of an image's layers.
func filesOf(t *testing.T, img v1.Image) map[string]int64 {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]int64{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				files["/"+strings.TrimPrefix(h.Name, "./")] = h.Size
			}
		}
		rc.Close()
	}
	return files
}

// deploy/image/build.sh (what `make image` runs) writes an OCI layout of
// one image with gpupin, both probe programs, glibc and the CA
// certificates; a DaemonSet naming it by digest; and the image runs:
// gpupin inside reads node facts, through the glibc it carries.
func TestImageBuildsAndRunsSimulated(t *testing.T) {
	testenv.Daemons(t) // builds gpupin's image, then runs it on containerd
	out := filepath.Join(t.TempDir(), "image")
	cmd := exec.Command("./build.sh", out, "registry.example/gpupin/gpupin", "0.1.0-test")
	cmd.Env = append(os.Environ(), "PUSH=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, b)
	}
	index, err := os.ReadFile(filepath.Join(out, "index"))
	if err != nil {
		t.Fatal(err)
	}
	digest := strings.TrimSpace(string(index))
	ds, err := os.ReadFile(filepath.Join(out, "daemonset.yaml"))
	if err != nil || !strings.Contains(string(ds), "image: registry.example/gpupin/gpupin@"+digest) {
		t.Fatalf("the DaemonSet does not name the image by digest %s: %v\n%s", digest, err, ds)
	}

	lp, err := layout.FromPath(filepath.Join(out, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != digest {
		t.Fatalf("layout index %+v, %v: want the one index %s", im, err, digest)
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	children, err := idx.IndexManifest()
	if err != nil || len(children.Manifests) != 1 || children.Manifests[0].Platform.Architecture != "amd64" {
		t.Fatalf("image index %+v, %v: want one linux/amd64 image", children, err)
	}
	img, err := idx.Image(children.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	files := filesOf(t, img)
	for _, f := range []string{"/usr/local/bin/gpupin", "/usr/lib/gpupin/gpupin-cuda-probe", "/usr/lib/gpupin/gpupin-sim-probe",
		"/etc/ssl/certs/ca-certificates.crt", "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"} {
		if files[f] == 0 {
			t.Errorf("the image lacks %s", f)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/local/bin/gpupin" {
		t.Fatalf("entrypoint %v, %v", cf.Config.Entrypoint, err)
	}

	// Through a registry into containerd, as a node gets it, and run.
	reg := testenv.Registry(t)
	ref, err := name.ParseReference(reg.Host + "/gpupin/gpupin:0.1.0-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	rt := testenv.Runtime(t)
	ctx := context.Background()
	child := reg.Host + "/gpupin/gpupin@" + children.Manifests[0].Digest.String()
	if _, err := rt.Pull(ctx, child, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	node := filepath.Join(dir, "node.json")
	os.WriteFile(node, []byte(`{"driver":"580.82.07","cuda":"13.0","gpus":[{"index":0,"uuid":"GPU-img","name":"NVIDIA H100 80GB HBM3","cc":"9.0"}]}`), 0o644)
	res, err := rt.Run(ctx, containerd.RunSpec{Image: child, Args: []string{"/usr/local/bin/gpupin", "detect", "--node", "/node.json"},
		Mounts: []containerd.Mount{{Source: node, Destination: "/node.json"}}, Hardened: true, Role: "probe", Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 || !strings.Contains(string(res.Output), "GPU 0  NVIDIA H100 80GB HBM3") {
		t.Fatalf("gpupin detect in the image: %v (exit %d):\n%s", err, res.ExitCode, res.Output)
	}
}
