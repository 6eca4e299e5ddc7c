package build

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

const specYAML = `
engine: vllm
version: 0.11.0
variants:
  - name: cu13
    cuda: "13.0"
    base: scratch
    platforms: [linux/amd64, linux/arm64]
    layers:
      - dir: ./app
        dest: /opt/app
      - tar: extra.tar
    env:
      VLLM_HOME: /opt/app
    labels:
      io.gpupin.probe: torch
    entrypoint: [/opt/app/run]
    archs: "8.0 9.0 12.0+PTX"
  - name: cu129
    cuda: "12.9"
    base: scratch
    platforms: [linux/amd64, linux/arm64]
    layers:
      - dir: ./app
        dest: /opt/app
    labels:
      io.gpupin.probe: cuda
    cmd: [serve]
`

// writeTree writes a spec's inputs under dir.
func writeTree(t *testing.T, dir string, spec string) {
	t.Helper()
	files := map[string]string{
		"app/run":            "#!/bin/sh\necho run\n",
		"app/lib/model.py":   "print('model')\n",
		"app/lib/weights.md": "weights\n",
		"gpupin.yaml":        spec,
	}
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "app/run"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("run", filepath.Join(dir, "app/start")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "extra.tar"))
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	body := []byte("extra\n")
	tw.WriteHeader(&tar.Header{Name: "etc/extra", Mode: 0o600, Size: int64(len(body)), Uid: 1000, Gid: 1000, Uname: "ci", ModTime: time.Now()})
	tw.Write(body)
	tw.Close()
	f.Close()
}

func buildIn(t *testing.T, dir string, opts BuildOptions) *BuildResult {
	t.Helper()
	s, err := LoadSpec(filepath.Join(dir, "gpupin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Spec = s
	epoch := time.Unix(0, 0)
	if opts.Epoch == nil {
		opts.Epoch = &epoch
	}
	res, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestBuildReproducible(t *testing.T) {
	// Two checkouts of the same inputs, at different times and paths.
	a, b := t.TempDir(), t.TempDir()
	writeTree(t, a, specYAML)
	time.Sleep(1100 * time.Millisecond) // different mtimes
	writeTree(t, b, specYAML)
	ra := buildIn(t, a, BuildOptions{})
	rb := buildIn(t, b, BuildOptions{})
	if !reflect.DeepEqual(ra, rb) {
		t.Fatalf("same inputs, different results:\n%+v\n%+v", ra, rb)
	}
	if len(ra.Images) != 4 {
		t.Fatalf("%d images, want 4", len(ra.Images))
	}

	// One file changes: only the dir layer's digest changes.
	if err := os.WriteFile(filepath.Join(b, "app/lib/model.py"), []byte("print('model v2')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rc := buildIn(t, b, BuildOptions{})
	for i := range ra.Images {
		la, lc := ra.Images[i].Layers, rc.Images[i].Layers
		if len(la) != len(lc) {
			t.Fatalf("image %d: %d layers, then %d", i, len(la), len(lc))
		}
		for j := range la {
			changed := la[j] != lc[j]
			if wantChanged := j == 0; changed != wantChanged {
				t.Errorf("image %d (%s %s) layer %d changed=%v, want %v", i, ra.Images[i].Variant, ra.Images[i].Platform, j, changed, wantChanged)
			}
		}
		if ra.Images[i].Digest == rc.Images[i].Digest {
			t.Errorf("image %d digest unchanged after a file changed", i)
		}
	}

	// Another SOURCE_DATE_EPOCH stamps other times: other digests.
	later := time.Unix(1700000000, 0)
	rd := buildIn(t, a, BuildOptions{Epoch: &later})
	if rd.Images[0].Digest == ra.Images[0].Digest {
		t.Error("epoch ignored: same digest")
	}
}

func TestBuildLayerContents(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, specYAML)
	s, err := LoadSpec(filepath.Join(dir, "gpupin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := buildImage(s, s.Variants[0], "linux/arm64", time.Unix(42, 0), CompressionKeep, nil)
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := img.Layers()
	type ent struct {
		name     string
		mode     int64
		uid, gid int
		mtime    int64
		link     string
	}
	read := func(l v1.Layer) []ent {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		var out []ent
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() || h.Uname != "" || h.Gname != "" {
				t.Errorf("%s: atime/ctime/owner names kept: %+v", h.Name, h)
			}
			out = append(out, ent{h.Name, h.Mode, h.Uid, h.Gid, h.ModTime.Unix(), h.Linkname})
		}
		return out
	}
	want0 := []ent{
		{"opt/", 0o755, 0, 0, 42, ""},
		{"opt/app/", 0o755, 0, 0, 42, ""},
		{"opt/app/lib/", 0o755, 0, 0, 42, ""},
		{"opt/app/lib/model.py", 0o644, 0, 0, 42, ""},
		{"opt/app/lib/weights.md", 0o644, 0, 0, 42, ""},
		{"opt/app/run", 0o755, 0, 0, 42, ""},
		{"opt/app/start", 0o777, 0, 0, 42, "run"},
	}
	if got := read(ls[0]); !reflect.DeepEqual(got, want0) {
		t.Errorf("dir layer:\n got %v\nwant %v", got, want0)
	}
	if got, want := read(ls[1]), []ent{{"etc/extra", 0o644, 0, 0, 42, ""}}; !reflect.DeepEqual(got, want) {
		t.Errorf("tar layer: got %v, want %v", got, want)
	}
	cf, _ := img.ConfigFile()
	if cf.Architecture != "arm64" || cf.OS != "linux" || cf.Created.Unix() != 42 {
		t.Errorf("config platform/created: %s/%s %v", cf.OS, cf.Architecture, cf.Created)
	}
	env := strings.Join(cf.Config.Env, " ")
	if !strings.Contains(env, "CUDA_VERSION=13.0") || !strings.Contains(env, "VLLM_HOME=/opt/app") {
		t.Errorf("env %v", cf.Config.Env)
	}
	if cf.Config.Labels[images.AnnotationProbe] != "torch" || cf.Config.Labels[images.AnnotationArchs] != "8.0,9.0,12.0+PTX" {
		t.Errorf("labels %v", cf.Config.Labels)
	}
	for _, h := range cf.History {
		if h.Created.Unix() != 42 {
			t.Errorf("history entry at %v, want the epoch", h.Created)
		}
	}
}

func TestBuildOutputLayout(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, specYAML)
	out := filepath.Join(t.TempDir(), "oci")
	res := buildIn(t, dir, BuildOptions{Output: out})
	lp, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	rm, _ := root.IndexManifest()
	if len(rm.Manifests) != 1 || rm.Manifests[0].Digest.String() != res.Index ||
		rm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "0.11.0" {
		t.Fatalf("layout index.json %+v, want one entry %s named 0.11.0", rm.Manifests, res.Index)
	}
	idx, err := root.ImageIndex(rm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	var got []string
	for _, m := range im.Manifests {
		got = append(got, m.Annotations[images.AnnotationVariant]+"@"+m.Platform.Architecture)
		// The layout holds every blob of every child.
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		ls, _ := img.Layers()
		for _, l := range ls {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatalf("blob missing from layout: %v", err)
			}
			rc.Close()
		}
	}
	if w := []string{"cu129@amd64", "cu129@arm64", "cu13@amd64", "cu13@arm64"}; !reflect.DeepEqual(got, w) {
		t.Errorf("layout entries %v, want %v", got, w)
	}
}

// Build on a registry base, push, and read back: the children we made carry
// the metadata on their own manifests too.
func TestBuildPush(t *testing.T) {
	reg := testenv.Registry(t)
	ctx := context.Background()
	var entries []sandbox.IndexEntry
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := sandbox.Image(sandbox.ImageSpec{Arch: arch, Env: []string{"CUDA_VERSION=13.0.2"}})
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, sandbox.IndexEntry{Image: img, Platform: &v1.Platform{OS: "linux", Architecture: arch}})
	}
	if _, err := sandbox.PushIndex(ctx, reg.Host+"/base/cuda:13.0", entries); err != nil {
		t.Fatal(err)
	}
	spec := strings.Replace(specYAML, "engine: vllm\n", "engine: vllm\nrepository: "+reg.Host+"/org/vllm\n", 1)
	spec = strings.Replace(spec, "base: scratch", "base: "+reg.Host+"/base/cuda:13.0", 1)
	dir := t.TempDir()
	writeTree(t, dir, spec)
	res := buildIn(t, dir, BuildOptions{Push: true})
	if res.Publish == nil || !res.Publish.Verified || res.Publish.Digest != res.Index {
		t.Fatalf("publish result %+v", res.Publish)
	}
	for _, e := range res.Publish.Entries {
		img, err := remote.Image(testenv.MustRef(t, reg.Host+"/org/vllm@"+e.Digest))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := img.Manifest()
		if m.Annotations[images.AnnotationVariant] != e.Variant || m.Annotations[images.AnnotationEngine] != "vllm" {
			t.Errorf("child %s manifest annotations %v", e.Digest, m.Annotations)
		}
		ls, _ := img.Layers()
		wantLayers := 1 // cu129: scratch + app
		if e.Variant == "cu13" {
			wantLayers = 3 // busybox base + app + tar
		}
		if len(ls) != wantLayers {
			t.Errorf("%s %s: %d layers, want %d", e.Variant, e.Platform, len(ls), wantLayers)
		}
	}
	// The alias tag exists and points at an index of the variant.
	if _, err := remote.Index(testenv.MustRef(t, reg.Host+"/org/vllm:0.11.0-cu13")); err != nil {
		t.Error(err)
	}
}

func TestSpecValidation(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, specYAML)
	cases := []struct {
		name, from, to, want string
	}{
		{"unknown field", "engine: vllm", "engine: vllm\nengin: x", `unknown field "engin"`},
		{"no engine", "engine: vllm", "", "engine: required"},
		{"bad version", "version: 0.11.0", "version: 0.11.0+cu", "version: "},
		{"cuda contradicts name", `cuda: "12.9"`, `cuda: "12.8"`, "variants[1].cuda: 12.8, but the name cu129 claims CUDA 12.9"},
		{"cuda missing", `cuda: "12.9"`, ``, "variants[1].cuda: required"},
		{"bad variant name", "name: cu129", "name: CU129", "variants[1].name: "},
		{"duplicate name", "name: cu129\n    cuda: \"12.9\"", "name: cu13\n    cuda: \"13.0\"", "variants[1].name: cu13 is already variants[0]"},
		{"bad platform", "platforms: [linux/amd64, linux/arm64]\n    layers:\n      - dir: ./app\n        dest: /opt/app\n    labels:\n      io.gpupin.probe: cuda",
			"platforms: [amd64]\n    labels:\n      io.gpupin.probe: cuda", "variants[1].platforms[0]: \"amd64\""},
		{"relative dest", "dest: /opt/app\n      - tar", "dest: opt/app\n      - tar", "variants[0].layers[0].dest: "},
		{"missing dir", "dir: ./app\n        dest: /opt/app\n      - tar", "dir: ./nope\n        dest: /opt/app\n      - tar", "variants[0].layers[0].dir: "},
		{"bad probe", "io.gpupin.probe: torch", "io.gpupin.probe: pytorch", "variants[0].labels.io.gpupin.probe: "},
		{"bad archs", `archs: "8.0 9.0 12.0+PTX"`, `archs: "sm_90"`, "variants[0].archs: "},
		{"no base", "base: scratch\n    platforms: [linux/amd64, linux/arm64]\n    layers:\n      - dir: ./app\n        dest: /opt/app\n      - tar", "platforms: [linux/amd64]\n    layers:\n      - dir: ./app\n        dest: /opt/app\n      - tar", "variants[0].base: required"},
		{"env contradicts cuda", "VLLM_HOME: /opt/app", "CUDA_VERSION: 12.9.1", "variants[0].env.CUDA_VERSION: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			y := strings.Replace(specYAML, c.from, c.to, 1)
			if y == specYAML {
				t.Fatalf("case does not change the spec: %q", c.from)
			}
			_, err := ParseSpec([]byte(y), dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := ParseSpec([]byte(specYAML), dir); err != nil {
		t.Errorf("valid spec refused: %v", err)
	}
}
