package build

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// skopeoCopy copies src to dst with Debian's skopeo, every platform of an
// index (--all), as a mirroring job does.
func skopeoCopy(t *testing.T, src, dst string) {
	t.Helper()
	bin, err := exec.LookPath("skopeo")
	if err != nil {
		t.Fatalf("skopeo is not installed (apt-get install skopeo; scripts/deps.sh does): %v", err)
	}
	cmd := exec.Command(bin, "copy", "--all", "--src-tls-verify=false", "--dest-tls-verify=false", "docker://"+src, "docker://"+dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("skopeo copy %s %s: %v\n%s", src, dst, err, out)
	}
}

func headDigest(t *testing.T, ref string) string {
	t.Helper()
	d, err := remote.Head(testenv.MustRef(t, ref))
	if err != nil {
		t.Fatalf("head %s: %v", ref, err)
	}
	return d.Digest.String()
}

// rawIndex reads an index manifest as the registry serves it.
func rawIndex(t *testing.T, ref string) []byte {
	t.Helper()
	d, err := remote.Get(testenv.MustRef(t, ref))
	if err != nil {
		t.Fatalf("get %s: %v", ref, err)
	}
	return d.Manifest
}

// A published tag copied with skopeo copy --all, within a registry and to
// the other implementation, keeps its index digest (issue 10, point 4):
// publish writes no artifactType on image-manifest entries, which skopeo
// 1.9 drops and so would rewrite. The copy resolves to the same variants.
// Both sources: images read from a registry, and images built in memory
// (go-containerregistry would give those entries an artifactType from the
// config's media type).
// An index written as go-containerregistry writes it by default (entries
// with artifactType) is the control: its digest does change, so the check
// would see it.
func TestPublishedIndexSurvivesSkopeoCopy(t *testing.T) {
	ctx := context.Background()
	regs := testenv.Registries(t)
	for i, reg := range regs {
		other := regs[(i+1)%len(regs)]
		t.Run(reg.Name, func(t *testing.T) {
			t.Run("from a registry", func(t *testing.T) {
				mirrorCheck(t, reg.Host, other.Host, "org/vllm", pushSources(t, reg.Host, twoVariants()))
			})
			t.Run("in memory (gpupin build --push)", func(t *testing.T) {
				mirrorCheck(t, reg.Host, other.Host, "org/vllm-built", memorySources(t, twoVariants()))
			})
			// The control.
			img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1"}})
			if err != nil {
				t.Fatal(err)
			}
			control := reg.Host + "/control/vllm:0.11.0"
			cd, err := sandbox.PushIndex(ctx, control, []sandbox.IndexEntry{{Image: img, Platform: &v1.Platform{OS: "linux", Architecture: "amd64"},
				Annotations: map[string]string{images.AnnotationVariant: "cu129", images.AnnotationCUDA: "12.9"}}})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(rawIndex(t, control)), `"artifactType"`) {
				t.Fatal("the control index has no artifactType: go-containerregistry changed, and the control proves nothing")
			}
			skopeoCopy(t, control, other.Host+"/control-copy/vllm:0.11.0")
			if got := headDigest(t, other.Host+"/control-copy/vllm:0.11.0"); got == cd.String() {
				t.Errorf("the control kept its digest %s through skopeo: this skopeo keeps artifactType, and the check below proves nothing here", got)
			}
		})
	}
}

// memorySources are the variants as gpupin build hands them to Publish:
// images in memory, one per platform.
func memorySources(t *testing.T, vs []srcVariant) []Variant {
	t.Helper()
	var out []Variant
	for _, v := range vs {
		var imgs []v1.Image
		for _, arch := range v.archs {
			l, err := sandbox.FileLayer(map[string][]byte{"etc/gpupin-test": []byte(v.name + "/" + arch + "/memory")})
			if err != nil {
				t.Fatal(err)
			}
			img, err := sandbox.Image(sandbox.ImageSpec{Arch: arch, Env: v.env, Labels: v.labels, Layers: []v1.Layer{l}})
			if err != nil {
				t.Fatal(err)
			}
			imgs = append(imgs, img)
		}
		out = append(out, Variant{Name: v.name, Images: imgs})
	}
	return out
}

// mirrorCheck publishes the variants as host/REPO:0.11.0, copies the tag
// with skopeo to another repository there and to other, and checks that
// every copy has the published index digest and resolves to the same
// variants.
func mirrorCheck(t *testing.T, host, other, repo string, variants []Variant) {
	t.Helper()
	ctx := context.Background()
	tag := host + "/" + repo + ":0.11.0"
	res, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, Engine: "vllm"})
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		Manifests []map[string]json.RawMessage `json:"manifests"`
	}
	if err := json.Unmarshal(rawIndex(t, tag), &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 4 {
		t.Fatalf("index has %d entries, want 4 (2 variants × 2 platforms)", len(idx.Manifests))
	}
	for j, m := range idx.Manifests {
		if _, ok := m["artifactType"]; ok {
			t.Errorf("entry %d carries artifactType %s: image-manifest entries need none", j, m["artifactType"])
		}
	}
	want, err := (&images.Resolver{}).Resolve(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{host + "/mirror/" + repo + ":0.11.0", other + "/mirror/" + repo + ":0.11.0"} {
		skopeoCopy(t, tag, dst)
		if got := headDigest(t, dst); got != res.Digest {
			t.Errorf("copied to %s: index %s, published %s: the copy changed the index", dst, got, res.Digest)
		}
		got, err := (&images.Resolver{}).Resolve(ctx, dst)
		if err != nil {
			t.Fatalf("resolve the copy %s: %v", dst, err)
		}
		if len(got.Variants) != len(want.Variants) {
			t.Fatalf("the copy has %d variants, the original %d", len(got.Variants), len(want.Variants))
		}
		for j := range want.Variants {
			g, w := got.Variants[j], want.Variants[j]
			if g.Digest != w.Digest || g.Metadata != w.Metadata || g.Platform != w.Platform || g.Derived {
				t.Errorf("copy's entry %d = %s %s %s %+v, original %s %s %s %+v", j, g.Variant, g.Platform, g.Digest, g.Metadata, w.Variant, w.Platform, w.Digest, w.Metadata)
			}
		}
	}
}
