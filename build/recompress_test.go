package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// checkRecompressed checks an image re-encoded as zstd against its source:
// the same config (so the same diff IDs), every layer zstd, and each
// layer's bytes decoding to its diff ID.
func checkRecompressed(t *testing.T, src, got v1.Image) {
	t.Helper()
	sc, _ := src.ConfigName()
	gc, _ := got.ConfigName()
	if sc != gc {
		t.Errorf("config %s, source's %s: the diff IDs must not change", gc, sc)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	m, _ := got.Manifest()
	if m.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", m.MediaType)
	}
	ls, _ := got.Layers()
	if len(ls) != len(cf.RootFS.DiffIDs) {
		t.Fatalf("%d layers, %d diff IDs", len(ls), len(cf.RootFS.DiffIDs))
	}
	for i, l := range ls {
		if m.Layers[i].MediaType != types.OCILayerZStd {
			t.Errorf("layer %d is %s, want zstd", i, m.Layers[i].MediaType)
		}
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, rc); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		rc.Close()
		if d := "sha256:" + hex.EncodeToString(h.Sum(nil)); d != cf.RootFS.DiffIDs[i].String() {
			t.Errorf("layer %d decodes to %s, its diff ID is %s", i, d, cf.RootFS.DiffIDs[i])
		}
	}
}

// publish --compression zstd: the index keeps its entries' order and
// annotations, the children are new manifests over the same configs.
func TestPublishRecompressedKeepsOrderAndAnnotations(t *testing.T) {
	reg := testenv.Registry(t)
	ctx := context.Background()
	vars := pushSources(t, reg.Host, twoVariants())
	ann := map[string]string{"org.opencontainers.image.source": "https://example.com/vllm"}
	plain, err := Publish(ctx, PublishOptions{Tag: reg.Host + "/org/vllm:1.0", Engine: "vllm", Variants: vars, Annotations: ann})
	if err != nil {
		t.Fatal(err)
	}
	zst, err := Publish(ctx, PublishOptions{Tag: reg.Host + "/org/vllm-zstd:1.0", Engine: "vllm", Variants: vars, Annotations: ann, Compression: CompressionZstd})
	if err != nil {
		t.Fatal(err)
	}
	if !zst.Verified || len(zst.Entries) != len(plain.Entries) {
		t.Fatalf("zstd publish: verified %v, %d entries (plain: %d)", zst.Verified, len(zst.Entries), len(plain.Entries))
	}
	for i, e := range zst.Entries {
		p := plain.Entries[i]
		if e.Variant != p.Variant || e.Platform != p.Platform {
			t.Errorf("entry %d is %s %s, the plain index's %s %s: order changed", i, e.Variant, e.Platform, p.Variant, p.Platform)
		}
		if !reflect.DeepEqual(e.Annotations, p.Annotations) {
			t.Errorf("entry %d annotations %v, want %v", i, e.Annotations, p.Annotations)
		}
		if e.Digest == p.Digest {
			t.Errorf("entry %d: the child was not re-encoded", i)
		}
		src, err := remote.Image(testenv.MustRef(t, reg.Host+"/org/vllm@"+p.Digest))
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(testenv.MustRef(t, reg.Host+"/org/vllm-zstd@"+e.Digest))
		if err != nil {
			t.Fatal(err)
		}
		checkRecompressed(t, src, got)
	}
	idx, err := remote.Index(testenv.MustRef(t, reg.Host+"/org/vllm-zstd:1.0"))
	if err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	if im.Annotations["org.opencontainers.image.source"] != "https://example.com/vllm" {
		t.Errorf("index annotations %v", im.Annotations)
	}
	// Re-encoding the same variant again gives the same digests: a CI
	// rerun publishes nothing new.
	again, err := Publish(ctx, PublishOptions{Tag: reg.Host + "/org/vllm-zstd:1.0", Engine: "vllm", Variants: vars, Annotations: ann, Compression: CompressionZstd, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != zst.Digest {
		t.Errorf("a second re-encoding made index %s, the first %s", again.Digest, zst.Digest)
	}
}

// A Docker schema 2 image becomes an OCI one (Docker's format has no zstd
// layers), its config bytes unchanged; a corrupt source is refused.
func TestRecompressDockerImage(t *testing.T) {
	l, err := sandbox.FileLayer(map[string][]byte{"etc/x": []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.MediaType(img, types.DockerManifestSchema2)
	sp := &spool{}
	defer sp.close()
	got, err := recompress(img, CompressionZstd, sp)
	if err != nil {
		t.Fatal(err)
	}
	checkRecompressed(t, img, got)
	m, _ := got.Manifest()
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %s", m.Config.MediaType)
	}
	raw, _ := got.RawConfigFile()
	want, _ := img.RawConfigFile()
	if string(raw) != string(want) {
		t.Error("config bytes changed")
	}
	// Back to gzip: the same diff IDs again.
	back, err := recompress(got, CompressionGzip, sp)
	if err != nil {
		t.Fatal(err)
	}
	bl, _ := back.Layers()
	gd, _ := bl[0].DiffID()
	wd, _ := l.DiffID()
	bm, _ := back.Manifest()
	if gd != wd || bm.Layers[0].MediaType != types.OCILayer {
		t.Errorf("gzip again: diff ID %s (want %s), type %s", gd, wd, bm.Layers[0].MediaType)
	}

	// A config that names another diff ID than the layer holds.
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
	bad, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := recompress(bad, CompressionZstd, sp); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("err = %v, want the source called corrupt", err)
	}
}

// gpupin build --compression zstd: its own layers and the base's are zstd.
func TestBuildZstd(t *testing.T) {
	reg := testenv.Registry(t)
	ctx := context.Background()
	base, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=13.0.2"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.PushImage(ctx, reg.Host+"/base/cuda:13.0", base); err != nil {
		t.Fatal(err)
	}
	spec := strings.Replace(specYAML, "engine: vllm\n", "engine: vllm\nrepository: "+reg.Host+"/org/vllm\n", 1)
	spec = strings.Replace(spec, "base: scratch", "base: "+reg.Host+"/base/cuda:13.0", 1)
	spec = strings.ReplaceAll(spec, "platforms: [linux/amd64, linux/arm64]", "platforms: [linux/amd64]")
	dir := t.TempDir()
	writeTree(t, dir, spec)
	res := buildIn(t, dir, BuildOptions{Push: true, Compression: CompressionZstd})
	for _, e := range res.Publish.Entries {
		img, err := remote.Image(testenv.MustRef(t, reg.Host+"/org/vllm@"+e.Digest))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := img.Manifest()
		for i, l := range m.Layers {
			if l.MediaType != types.OCILayerZStd {
				t.Errorf("%s layer %d is %s", e.Variant, i, l.MediaType)
			}
		}
		checkRecompressed(t, img, img)
	}
	// The same spec gzipped has the same diff IDs.
	out := t.TempDir()
	plain := buildIn(t, dir, BuildOptions{Output: out})
	lp, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := lp.IndexManifest()
	idx, err := lp.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	for i, im := range plain.Images {
		gi, err := idx.Image(v1.Hash{Algorithm: "sha256", Hex: strings.TrimPrefix(im.Digest, "sha256:")})
		if err != nil {
			t.Fatal(err)
		}
		zi, err := remote.Image(testenv.MustRef(t, reg.Host+"/org/vllm@"+res.Images[i].Digest))
		if err != nil {
			t.Fatal(err)
		}
		gcf, _ := gi.ConfigFile()
		zcf, _ := zi.ConfigFile()
		if !reflect.DeepEqual(gcf.RootFS.DiffIDs, zcf.RootFS.DiffIDs) {
			t.Errorf("%s: zstd diff IDs %v, gzip %v", im.Variant, zcf.RootFS.DiffIDs, gcf.RootFS.DiffIDs)
		}
	}
}
