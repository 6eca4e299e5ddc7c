package images_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/node"
)

// The variants of the test engine, as CI publishes vLLM today.
var (
	cu13 = sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", Archs: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"}
	// cu129 has no 12.0 kernels and no PTX: Blackwell workstation GPUs are out.
	cu129 = sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "7.0,7.5,8.0,8.6,8.9,9.0"}
)

// The upstream-style images without gpupin annotations: their variants are
// derived from CUDA_VERSION and NVIDIA_REQUIRE_CUDA, as nvidia/cuda bases set them.
const (
	requireCU13  = "cuda>=13.0 brand=tesla,driver>=570,driver<571 brand=nvidia,driver>=570,driver<571"
	requireCU129 = "cuda>=12.9 brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536"
)

// fixture is a real registry on loopback holding the test engines.
type fixture struct {
	reg *sandbox.Registry
	res *images.Resolver
	// Refs of what was published.
	engine, derived, multi, custom string
	// childAnnotated is an index whose entries carry no annotations while the
	// child manifests do: one more manifest GET each, still no blob.
	childAnnotated string
	// required is an annotated index whose entries carry their images'
	// requirement sets (io.gpupin.cuda.require), as publish writes them:
	// cu13 needs arch>=9.0, cu129 has the tesla 535 branch.
	required string
}

// requiredEnvs are the configs of the required index's images.
var requiredEnvs = map[string][]string{
	"cu13":  {"CUDA_VERSION=13.0.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0", "NVIDIA_REQUIRE_ARCH=arch>=9.0"},
	"cu129": {"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535,driver<536"},
}

func startFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(func() { reg.Close() })
	f := &fixture{reg: reg, res: &images.Resolver{},
		engine:         reg.Host + "/vllm:0.11.0",
		derived:        reg.Host + "/vllm/vllm-openai:v0.20.0",
		multi:          reg.Host + "/sglang:0.5.0",
		custom:         reg.Host + "/myorg/vllm-custom:1",
		childAnnotated: reg.Host + "/tgi:3.0",
		required:       reg.Host + "/trtllm:1.0",
	}
	// The most compatible variant first, as publish orders an index
	// (docs/image-metadata.md, "Order"); the choice must still prefer the
	// newest CUDA.
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "vllm", "0.11.0", []sandbox.EngineVariant{cu129, cu13}); err != nil {
		t.Fatalf("publish vllm: %v", err)
	}
	d13 := sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", NoAnnotations: true, Env: []string{"NVIDIA_REQUIRE_CUDA=" + requireCU13}}
	d129 := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", NoAnnotations: true, Env: []string{"NVIDIA_REQUIRE_CUDA=" + requireCU129}}
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "vllm/vllm-openai", "v0.20.0", []sandbox.EngineVariant{d13, d129}); err != nil {
		t.Fatalf("publish derived: %v", err)
	}
	arm13 := cu13
	arm13.Arch = "arm64"
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "sglang", "0.5.0", []sandbox.EngineVariant{cu13, arm13, cu129}); err != nil {
		t.Fatalf("publish multi-platform: %v", err)
	}
	var entries []sandbox.IndexEntry
	for _, v := range []sandbox.EngineVariant{cu13, cu129} {
		md := images.Metadata{Engine: "tgi", Variant: v.Name, CUDA: v.CUDA, Archs: v.Archs}
		img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=" + v.CUDA + ".0"}, Annotations: md.Annotations()})
		if err != nil {
			t.Fatalf("child-annotated image: %v", err)
		}
		entries = append(entries, sandbox.IndexEntry{Image: img, Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}})
	}
	if _, err := sandbox.PushIndex(ctx, f.childAnnotated, entries); err != nil {
		t.Fatalf("push child-annotated index: %v", err)
	}
	entries = nil
	for _, v := range []sandbox.EngineVariant{cu13, cu129} {
		req, err := images.RequireAnnotation(requiredEnvs[v.Name])
		if err != nil {
			t.Fatal(err)
		}
		md := images.Metadata{Engine: "trtllm", EngineVersion: "1.0", Variant: v.Name, CUDA: v.CUDA, Archs: v.Archs, Require: req}
		img, err := sandbox.Image(sandbox.ImageSpec{Env: requiredEnvs[v.Name]})
		if err != nil {
			t.Fatalf("required image: %v", err)
		}
		entries = append(entries, sandbox.IndexEntry{Image: img, Annotations: md.Annotations(), Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}})
	}
	if _, err := sandbox.PushIndex(ctx, f.required, entries); err != nil {
		t.Fatalf("push index with requirement sets: %v", err)
	}
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.8.1"}})
	if err != nil {
		t.Fatalf("custom image: %v", err)
	}
	if _, err := sandbox.PushImage(ctx, f.custom, img); err != nil {
		t.Fatalf("push custom: %v", err)
	}
	return f
}

// plan does what `gpupin plan` does: resolve, resolve an image override
// instead, choose.
func (f *fixture) plan(t *testing.T, ref string, facts *node.Facts, override string) *images.Plan {
	t.Helper()
	ov, err := images.ParseOverride(override)
	if err != nil {
		t.Fatalf("ParseOverride(%q): %v", override, err)
	}
	set, err := f.res.Resolve(context.Background(), ref)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", ref, err)
	}
	if ov.Kind == images.OverrideImage {
		if set, err = f.res.Resolve(context.Background(), ov.Image); err != nil {
			t.Fatalf("Resolve(override %s): %v", ov.Image, err)
		}
	}
	return images.Choose(facts, set, ov)
}

// digestOf reads the digest a tag points at, straight from the registry.
func (f *fixture) digestOf(t *testing.T, ref string) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	d, err := remote.Head(r)
	if err != nil {
		t.Fatalf("head %s: %v", ref, err)
	}
	return d.Digest.String()
}

func gpu(i int, name, brand, cc string) node.GPU {
	return node.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d-%s", i, cc), Name: name, Brand: brand, CC: cc, MemoryMiB: 81559}
}

func facts(driver, cuda string, gpus ...node.GPU) *node.Facts {
	return &node.Facts{Driver: driver, CUDA: cuda, Platform: "linux/amd64", GPUs: gpus, Simulated: true}
}

var (
	h100      = gpu(0, "NVIDIA H100 80GB HBM3", "nvidia", "9.0")
	h100tesla = gpu(0, "NVIDIA H100 80GB HBM3", "tesla", "9.0")
	v100      = gpu(0, "Tesla V100-SXM2-32GB", "tesla", "7.0")
	a100      = gpu(0, "NVIDIA A100-SXM4-80GB", "nvidia", "8.0")
	h100at1   = gpu(1, "NVIDIA H100 80GB HBM3", "nvidia", "9.0")
	rtxPro    = gpu(0, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "nvidiartx", "12.0")
	rtxProAt1 = gpu(1, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "nvidiartx", "12.0")
	rtx4090   = gpu(0, "NVIDIA GeForce RTX 4090", "geforce", "8.9")
)

func TestChooseSimulatedNodes(t *testing.T) {
	f := startFixture(t)
	driverless := &node.Facts{Platform: "linux/amd64", GPUs: []node.GPU{}, Simulated: true,
		Unsupported: "no NVIDIA driver (NVML init: ERROR_LIBRARY_NOT_FOUND (12))"}
	arm := facts("580.82.07", "13.0", h100)
	arm.Platform = "linux/arm64"

	tests := []struct {
		name     string
		ref      string // default: the annotated engine
		node     *node.Facts
		override string
		want     []string          // candidate variants, in order
		rejected map[string]string // variant → substring of its reason
		outcome  string
		detail   string // substring of Detail
		derived  bool   // candidates' metadata derived
		warning  string // substring of the first candidate's warning
	}{
		{name: "H100 driver 580 CUDA 13.0", node: facts("580.82.07", "13.0", h100),
			want: []string{"cu13", "cu129"}, outcome: images.OutcomeReady},
		{name: "H100 driver 575 CUDA 12.9", node: facts("575.57.08", "12.9", h100),
			want:     []string{"cu129"},
			rejected: map[string]string{"cu13": "driver 575.57.08 supports CUDA 12.9; this variant needs 13.0: upgrade the driver or use a variant built for CUDA ≤ 12.9"},
			outcome:  images.OutcomeReady},
		{name: "V100 driver 580", node: facts("580.82.07", "13.0", v100),
			want:     []string{"cu129"},
			rejected: map[string]string{"cu13": "no kernels for GPU 0 (Tesla V100-SXM2-32GB, compute capability 7.0): its archs are 7.5,"},
			outcome:  images.OutcomeReady},
		{name: "Blackwell 12.0 driver 580", node: facts("580.82.07", "13.0", rtxPro),
			want:     []string{"cu13"},
			rejected: map[string]string{"cu129": "no kernels for GPU 0 (NVIDIA RTX PRO 6000 Blackwell Workstation Edition, compute capability 12.0)"},
			outcome:  images.OutcomeReady},
		{name: "Blackwell 12.0 driver 575: nothing fits", node: facts("575.57.08", "12.9", rtxPro),
			rejected: map[string]string{"cu13": "supports CUDA 12.9; this variant needs 13.0", "cu129": "no kernels for GPU 0"},
			outcome:  images.OutcomeNoCandidate, detail: "no variant of"},
		{name: "mixed A100 and H100", node: facts("580.82.07", "13.0", a100, h100at1),
			want: []string{"cu13", "cu129"}, outcome: images.OutcomeReady},
		{name: "mixed A100 and Blackwell: cu129 must cover GPU 1 too", node: facts("580.82.07", "13.0", a100, rtxProAt1),
			want:     []string{"cu13"},
			rejected: map[string]string{"cu129": "no kernels for GPU 1 ("},
			outcome:  images.OutcomeReady},
		{name: "no driver", node: driverless,
			outcome: images.OutcomeUnsupported, detail: "unsupported: no NVIDIA driver ("},
		{name: "arm64 node takes only arm64 entries", ref: f.multi, node: arm,
			want:     []string{"cu13"},
			rejected: map[string]string{"cu129": "published for linux/amd64 only, not for this node's linux/arm64"},
			outcome:  images.OutcomeReady},

		// Each override form.
		{name: "override auto", node: facts("580.82.07", "13.0", h100), override: "auto",
			want: []string{"cu13", "cu129"}, outcome: images.OutcomeReady},
		{name: "override none", node: facts("580.82.07", "13.0", h100), override: "none",
			outcome: images.OutcomeNone, detail: "override is none"},
		{name: "override variant", node: facts("580.82.07", "13.0", h100), override: "cu129",
			want: []string{"cu129"}, outcome: images.OutcomeReady},
		{name: "override variant auto would reject", node: facts("575.57.08", "12.9", h100), override: "cu13",
			want: []string{"cu13"}, outcome: images.OutcomeReady,
			warning: "forced by override; auto would reject it: driver 575.57.08 supports CUDA 12.9; this variant needs 13.0: upgrade the driver or use a variant built for CUDA ≤ 12.9"},
		{name: "override missing variant", node: facts("580.82.07", "13.0", h100), override: "cu118",
			outcome: images.OutcomeNoCandidate, detail: "override cu118: no such variant for linux/amd64 under " + f.engine + "; published: cu129, cu13"},
		{name: "override image", node: facts("580.82.07", "13.0", h100), override: f.custom,
			want: []string{"cu128"}, outcome: images.OutcomeReady, derived: true},
		{name: "override image the node cannot run", node: facts("550.54.15", "12.4", h100), override: f.custom,
			rejected: map[string]string{"cu128": "driver 550.54.15 supports CUDA 12.4; NVIDIA_REQUIRE_CUDA needs cuda>=12.8"},
			outcome:  images.OutcomeNoCandidate, derived: true},

		// Derived from NVIDIA_REQUIRE_CUDA: no annotations anywhere.
		{name: "derived: H100 driver 580", ref: f.derived, node: facts("580.82.07", "13.0", h100),
			want: []string{"cu13", "cu129"}, outcome: images.OutcomeReady, derived: true},
		{name: "derived: H100 driver 575 CUDA 12.9", ref: f.derived, node: facts("575.57.08", "12.9", h100),
			want:     []string{"cu129"},
			rejected: map[string]string{"cu13": "driver 575.57.08 supports CUDA 12.9; NVIDIA_REQUIRE_CUDA needs cuda>=13.0, and none of its 2 brand/driver branches matches GPU 0 (brand nvidia, driver 575.57.08)"},
			outcome:  images.OutcomeReady, derived: true},
		{name: "derived: tesla on driver 535 runs cu129 by forward compatibility", ref: f.derived, node: facts("535.104.05", "12.2", h100tesla),
			want:     []string{"cu129"},
			rejected: map[string]string{"cu13": "needs cuda>=13.0"},
			outcome:  images.OutcomeReady, derived: true},
		{name: "derived: tesla on driver 570 runs cu13 by forward compatibility, not cu129", ref: f.derived, node: facts("570.86.15", "12.8", h100tesla),
			want:     []string{"cu13"},
			rejected: map[string]string{"cu129": "needs cuda>=12.9"},
			outcome:  images.OutcomeReady, derived: true},
		{name: "derived: geforce on driver 535 has no branch", ref: f.derived, node: facts("535.104.05", "12.2", rtx4090),
			rejected: map[string]string{"cu129": "matches GPU 0 (brand geforce, driver 535.104.05)", "cu13": "needs cuda>=13.0"},
			outcome:  images.OutcomeNoCandidate, derived: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ref := tc.ref
			if ref == "" {
				ref = f.engine
			}
			p := f.plan(t, ref, tc.node, tc.override)
			if p.Outcome != tc.outcome {
				t.Errorf("outcome = %s, want %s (detail %q)", p.Outcome, tc.outcome, p.Detail)
			}
			var got []string
			for _, c := range p.Candidates {
				got = append(got, c.Variant)
				if c.Derived != tc.derived {
					t.Errorf("candidate %s: derived = %v, want %v", c.Variant, c.Derived, tc.derived)
				}
				if !strings.Contains(c.Ref, "@sha256:") || c.Platform != tc.node.Platform {
					t.Errorf("candidate %s: ref %q platform %q: want a digest ref for %s", c.Variant, c.Ref, c.Platform, tc.node.Platform)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("candidates = %v, want %v; rejected %+v", got, tc.want, p.Rejected)
			}
			reasons := map[string]string{}
			for _, r := range p.Rejected {
				reasons[r.Variant] = r.Reason
				if r.Reason == "" {
					t.Errorf("rejection of %s has no reason", r.Variant)
				}
				// Printed as "VARIANT: REASON": the reason does not say it again.
				if repeatsVariant(r) {
					t.Errorf("rejection of %s repeats the variant: %q", r.Variant, r.Reason)
				}
			}
			if len(reasons) != len(tc.rejected) {
				t.Errorf("rejected = %v, want reasons for %v", reasons, tc.rejected)
			}
			for v, sub := range tc.rejected {
				if !strings.Contains(reasons[v], sub) {
					t.Errorf("rejection of %s = %q, want it to contain %q", v, reasons[v], sub)
				}
			}
			if !strings.Contains(p.Detail, tc.detail) {
				t.Errorf("detail = %q, want it to contain %q", p.Detail, tc.detail)
			}
			if tc.warning != "" && (len(p.Candidates) == 0 || !strings.Contains(p.Candidates[0].Warning, tc.warning)) {
				t.Errorf("candidates %+v: want a warning containing %q", p.Candidates, tc.warning)
			}
			if tc.warning == "" && len(p.Candidates) > 0 && p.Candidates[0].Warning != "" {
				t.Errorf("unexpected warning %q", p.Candidates[0].Warning)
			}
			if !p.Simulated || p.Override != orAuto(tc.override) {
				t.Errorf("plan simulated=%v override=%q: want simulated and %q", p.Simulated, p.Override, orAuto(tc.override))
			}
		})
	}
}

func orAuto(s string) string {
	if s == "" {
		return "auto"
	}
	return s
}

// The candidate refs are the very children the alias tags point at: what
// gets pulled is what was chosen.
func TestChooseRefsAreTheVariantDigests(t *testing.T) {
	f := startFixture(t)
	p := f.plan(t, f.engine, facts("580.82.07", "13.0", h100), "auto")
	if len(p.Candidates) != 2 {
		t.Fatalf("candidates = %+v, want 2", p.Candidates)
	}
	for _, c := range p.Candidates {
		want := f.digestOf(t, f.engine+"-"+c.Variant)
		if c.Ref != f.reg.Host+"/vllm@"+want {
			t.Errorf("%s: ref %s, want %s/vllm@%s", c.Variant, c.Ref, f.reg.Host, want)
		}
		if c.Meta.Engine != "vllm" || c.Meta.Probe != "cuda" {
			t.Errorf("%s: metadata %+v: want engine vllm, probe cuda", c.Variant, c.Meta)
		}
	}
}

// Resolving and planning read manifests only: no layer blob is fetched, and
// a config blob only for images whose metadata is derived from it.
func TestResolveFetchesNoLayerBlob(t *testing.T) {
	f := startFixture(t)
	tests := []struct {
		name        string
		ref         string
		wantConfigs bool
	}{
		{"annotated index", f.engine, false},
		{"annotated index whose entries carry io.gpupin.cuda.require", f.required, false},
		{"index with annotations on the child manifests only", f.childAnnotated, false},
		{"index without annotations", f.derived, true},
		{"single derived image", f.custom, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			layers, configs := blobsOf(t, tc.ref)
			if len(layers) == 0 {
				t.Fatal("test images have no layers: the check would prove nothing")
			}
			f.reg.Reset()
			p := f.plan(t, tc.ref, facts("580.82.07", "13.0", h100), "auto")
			if p.Outcome != images.OutcomeReady {
				t.Fatalf("outcome %s: %s", p.Outcome, p.Detail)
			}
			nConfig := 0
			for _, q := range f.reg.Requests() {
				if q.Kind() != "blob" {
					continue
				}
				dg := q.Path[strings.LastIndex(q.Path, "/")+1:]
				switch {
				case layers[dg]:
					t.Errorf("%s %s: fetched a layer blob", q.Method, q.Path)
				case configs[dg] && tc.wantConfigs:
					nConfig++
				default:
					t.Errorf("%s %s: fetched a blob that is not a derived image's config", q.Method, q.Path)
				}
			}
			if tc.wantConfigs && nConfig == 0 {
				t.Error("derived metadata but no config blob fetched: the derivation read nothing")
			}
			if n := f.reg.Count("manifest", "GET"); n == 0 {
				t.Error("no manifest GET counted: the registry did not see the resolve")
			}
		})
	}
}

// blobsOf lists the layer and config digests of every image under ref.
func blobsOf(t *testing.T, ref string) (layers, configs map[string]bool) {
	t.Helper()
	layers, configs = map[string]bool{}, map[string]bool{}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	var imgs []v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range im.Manifests {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			imgs = append(imgs, img)
		}
	} else {
		img, err := desc.Image()
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	for _, img := range imgs {
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		configs[m.Config.Digest.String()] = true
		for _, l := range m.Layers {
			layers[l.Digest.String()] = true
		}
	}
	return layers, configs
}

// An annotation with a patch version (12.9.1) is still a 12.9 build: the
// driver's CUDA (12.9, major.minor from NVML) runs it.
func TestRejectComparesCUDAMajorMinor(t *testing.T) {
	f := &node.Facts{Driver: "575.57.08", CUDA: "12.9", Platform: "linux/amd64",
		GPUs: []node.GPU{{Index: 0, UUID: "GPU-1", Name: "H100", CC: "9.0"}}}
	for _, tc := range []struct {
		cuda   string
		reject bool
	}{{"12.9.1", false}, {"12.9", false}, {"12.10", true}, {"13.0.0", true}} {
		got := images.Reject(f, images.Variant{Metadata: images.Metadata{Variant: "cu129", CUDA: tc.cuda}})
		if (got != "") != tc.reject {
			t.Errorf("CUDA %s on a 12.9 driver: reject = %q, want reject %v", tc.cuda, got, tc.reject)
		}
	}
}

// One entry with malformed metadata (here another platform's) is a
// rejection; the good entries stay usable.
func TestChooseBadEntryIsARejection(t *testing.T) {
	ctx := context.Background()
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	good, _ := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.0"}})
	bad, _ := sandbox.Image(sandbox.ImageSpec{Arch: "arm64", Env: []string{"CUDA_VERSION=12.9.0"}})
	md := images.Metadata{Engine: "e", EngineVersion: "1", Variant: "cu129", CUDA: "12.9", Archs: "9.0"}
	badAnn := md.Annotations()
	badAnn[images.AnnotationArchs] = "Hopper;Blackwell"
	ref := reg.Host + "/e:1"
	if _, err := sandbox.PushIndex(ctx, ref, []sandbox.IndexEntry{
		{Image: good, Annotations: md.Annotations(), Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}},
		{Image: bad, Annotations: badAnn, Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}},
	}); err != nil {
		t.Fatal(err)
	}
	set, err := (&images.Resolver{}).Resolve(ctx, ref)
	if err != nil {
		t.Fatalf("one bad entry failed the whole reference: %v", err)
	}
	f := &node.Facts{Driver: "575.57.08", CUDA: "12.9", Platform: "linux/amd64", GPUs: []node.GPU{{Index: 0, UUID: "GPU-1", Name: "H100", CC: "9.0"}}}
	p := images.Choose(f, set, images.Override{Kind: images.OverrideAuto})
	if p.Outcome != images.OutcomeReady || len(p.Candidates) != 1 || p.Candidates[0].Platform != "linux/amd64" {
		t.Fatalf("plan %+v", p)
	}
	if len(p.Rejected) != 1 || !strings.Contains(p.Rejected[0].Reason, "unreadable metadata") || !strings.Contains(p.Rejected[0].Reason, "Hopper") {
		t.Fatalf("rejected = %+v", p.Rejected)
	}
}

// The requirement set an entry carries (io.gpupin.cuda.require) decides,
// as the image's own NVIDIA_REQUIRE_* would, and is read from the index
// alone: not a blob is fetched, for a candidate or for a rejection.
func TestChooseCarriedRequirementsFetchNoBlob(t *testing.T) {
	f := startFixture(t)
	teslaA100on535 := facts("535.104.05", "12.2", gpu(0, "NVIDIA A100-SXM4-80GB", "tesla", "8.0"))
	for _, tc := range []struct {
		name   string
		node   *node.Facts
		cands  string
		reject []string // variant: substring of its reason
	}{
		{"H100 on 580: both run", facts("580.82.07", "13.0", h100), "cu13,cu129", nil},
		{"A100 on 580: cu13 needs arch>=9.0", facts("580.82.07", "13.0", a100), "cu129",
			[]string{"cu13: GPU 0 (NVIDIA A100-SXM4-80GB) has compute capability 8.0; NVIDIA_REQUIRE_ARCH needs arch>=9.0"}},
		// CUDA 12.2 is below 12.9, but the tesla 535 branch admits it: the
		// CUDA version is not checked on top of the carried set.
		{"tesla A100 on 535: the forward-compatibility branch", teslaA100on535, "cu129",
			[]string{"cu13: NVIDIA_REQUIRE_ARCH needs arch>=9.0"}},
		{"nvidia-brand A100 on 535: no branch", facts("535.104.05", "12.2", a100), "",
			[]string{"cu129: driver 535.104.05 supports CUDA 12.2; NVIDIA_REQUIRE_CUDA needs cuda>=12.9, and none of its 1 brand/driver branches matches GPU 0 (brand nvidia"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.reg.Reset()
			p := f.plan(t, f.required, tc.node, "auto")
			var got []string
			for _, c := range p.Candidates {
				if c.Derived {
					t.Errorf("%s was derived: the index carries its metadata", c.Variant)
				}
				got = append(got, c.Variant)
			}
			if strings.Join(got, ",") != tc.cands {
				t.Errorf("candidates %v, want %s; rejected %+v", got, tc.cands, p.Rejected)
			}
			for _, want := range tc.reject {
				v, reason, _ := strings.Cut(want, ": ")
				found := false
				for _, r := range p.Rejected {
					if r.Variant == v && strings.Contains(r.Reason, reason) {
						found = true
					}
				}
				if !found {
					t.Errorf("no rejection of %s saying %q: %+v", v, reason, p.Rejected)
				}
			}
			for _, q := range f.reg.Requests() {
				if q.Kind() == "blob" {
					t.Errorf("fetched a blob: %s %s", q.Method, q.Path)
				}
			}
		})
	}
}

// A rejection's reason does not repeat the variant it is printed after
// ("cu129: cu129: driver …"), for any reference of the fixture on any node.
func TestRejectionReasonsDoNotRepeatTheVariant(t *testing.T) {
	f := startFixture(t)
	nodes := []*node.Facts{
		facts("575.57.08", "12.9", h100), facts("535.104.05", "12.2", v100), facts("580.82.07", "13.0", v100, h100at1),
		facts("580.82.07", "13.0", rtxPro), facts("550.54.15", "12.4", rtx4090), facts("535.104.05", "12.2", a100),
	}
	n := 0
	for _, ref := range []string{f.engine, f.derived, f.multi, f.custom, f.childAnnotated, f.required} {
		for _, fa := range nodes {
			for _, r := range f.plan(t, ref, fa, "auto").Rejected {
				n++
				if repeatsVariant(r) {
					t.Errorf("%s on driver %s: the reason repeats the variant: %s: %s", ref, fa.Driver, r.Variant, r.Reason)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no rejection at all: the check proves nothing")
	}
}

// repeatsVariant reports whether a rejection's reason names its variant
// anywhere, as a word of its own: the whole reason, not only its start
// ("…; cu13 needs 13.0" after "cu13: " says it twice).
func repeatsVariant(r images.Rejection) bool {
	return regexp.MustCompile(`(^|[^a-z0-9._-])` + regexp.QuoteMeta(r.Variant) + `($|[^a-z0-9._-])`).MatchString(r.Reason)
}

// Entries without a requirement set are judged by their CUDA version and
// minimum driver; the whole reason is what a person reads after the
// variant's name, so it is checked whole.
func TestRejectionReasonsWithoutRequirements(t *testing.T) {
	for _, tc := range []struct {
		name string
		node *node.Facts
		v    images.Variant
		want string
	}{
		{"CUDA newer than the driver's", facts("575.57.08", "12.9", h100),
			images.Variant{Metadata: images.Metadata{Variant: "cu13", CUDA: "13.0"}},
			"driver 575.57.08 supports CUDA 12.9; this variant needs 13.0: upgrade the driver or use a variant built for CUDA ≤ 12.9"},
		{"driver below the minimum", facts("575.57.08", "12.9", h100),
			images.Variant{Metadata: images.Metadata{Variant: "cu129", CUDA: "12.9", DriverMin: "580.65.06"}},
			"driver 575.57.08 is older than 580.65.06, the lowest this variant supports: upgrade the driver"},
		{"no kernels", facts("580.82.07", "13.0", v100),
			images.Variant{Metadata: images.Metadata{Variant: "cu13", CUDA: "13.0", Archs: "7.5,8.0,9.0"}},
			"no kernels for GPU 0 (Tesla V100-SXM2-32GB, compute capability 7.0): its archs are 7.5,8.0,9.0; use a variant built for 7.0"},
		{"runs", facts("580.82.07", "13.0", h100),
			images.Variant{Metadata: images.Metadata{Variant: "cu13", CUDA: "13.0", DriverMin: "580.65.06", Archs: "9.0"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := images.Reject(tc.node, tc.v)
			if got != tc.want {
				t.Errorf("Reject = %q\nwant     %q", got, tc.want)
			}
			if repeatsVariant(images.Rejection{Variant: tc.v.Variant, Reason: got}) {
				t.Errorf("the reason names %s again: %q", tc.v.Variant, got)
			}
		})
	}
}
