package build

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
)

// requireConfig is an upstream image's requirement set, as a config's Env.
type requireConfig struct {
	name    string
	variant string // what publish calls it, and nodes derive for it
	env     []string
}

// nvidiaCUDABase is NVIDIA_REQUIRE_CUDA as the nvidia/cuda bases write it:
// the main branch, then a brand=B,driver>=N,driver<N+1 forward-compatibility
// branch per datacenter and pro brand and per supported driver branch.
func nvidiaCUDABase(cuda string, drivers ...int) string {
	alts := []string{"cuda>=" + cuda}
	for _, d := range drivers {
		for _, b := range []string{"unknown", "grid", "tesla", "nvidia", "quadro", "quadrortx", "nvidiartx", "vapps", "vpc", "vcs", "vws", "cloudgaming"} {
			alts = append(alts, fmt.Sprintf("brand=%s,driver>=%d,driver<%d", b, d, d+1))
		}
	}
	return strings.Join(alts, " ")
}

func requireConfigs() []requireConfig {
	return []requireConfig{
		// Issue 10, point 1, first case: no-candidate on a V100 both ways.
		{"arch>=8.0", "cu129", []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9", "NVIDIA_REQUIRE_ARCH=arch>=8.0"}},
		// Second case: a candidate on a Tesla A100 with driver 535 both ways.
		{"tesla 535 branch", "cu13", []string{"CUDA_VERSION=13.0.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=tesla,driver>=535,driver<536"}},
		{"nvidia/cuda 12.9 base", "cu129", []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=" + nvidiaCUDABase("12.9", 535, 550, 560, 565, 570)}},
		// The main branch has a driver term (publish writes it as
		// io.gpupin.cuda.driver.min); a branch admits an older driver.
		{"main-branch driver, tesla 570 branch", "cu13", []string{"CUDA_VERSION=13.0.0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0,driver>=580.65.06 brand=tesla,driver>=570,driver<571"}},
		{"CUDA_VERSION only", "cu128", []string{"CUDA_VERSION=12.8.1"}},
		{"NVIDIA_DISABLE_REQUIRE", "cu13", []string{"CUDA_VERSION=13.0.0", "NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"}},
		{"NVIDIA_REQUIRE_CUDA only", "cu124", []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.4"}},
		{"archs, a brand branch and another variable", "cu129", []string{"CUDA_VERSION=12.9.0", "TORCH_CUDA_ARCH_LIST=8.0 9.0+PTX",
			"NVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535,driver<536", "NVIDIA_REQUIRE_DRIVER=driver>=535", "NVIDIA_REQUIRE_JETPACK=csv-mounts=all"}},
		{"a driver ceiling", "cu122", []string{"CUDA_VERSION=12.2.2", "NVIDIA_REQUIRE_DRIVER=driver<560"}},
		{"no GeForce", "cu129", []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_BRAND=brand!=geforce"}},
		{"an empty alternative", "cu129", []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9 , brand=tesla"}},
	}
}

func simGPU(i int, name, brand, cc string) node.GPU {
	return node.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d-%s-%s", i, brand, cc), Name: name, Brand: brand, CC: cc, MemoryMiB: 81559}
}

func simNode(driver, cuda string, gpus ...node.GPU) *node.Facts {
	return &node.Facts{Driver: driver, CUDA: cuda, Platform: "linux/amd64", Simulated: true, GPUs: gpus}
}

// equivalenceNodes are the nodes every config is judged on.
func equivalenceNodes() map[string]*node.Facts {
	gh200 := simNode("580.82.07", "13.0", simGPU(0, "NVIDIA GH200 480GB", "nvidia", "9.0"))
	gh200.Platform = "linux/arm64"
	return map[string]*node.Facts{
		"V100 (tesla, cc 7.0), driver 535":         simNode("535.104.05", "12.2", simGPU(0, "Tesla V100-SXM2-32GB", "tesla", "7.0")),
		"A100 (tesla), driver 535":                 simNode("535.104.05", "12.2", simGPU(0, "NVIDIA A100-SXM4-80GB", "tesla", "8.0")),
		"A100 (nvidia), driver 535":                simNode("535.104.05", "12.2", simGPU(0, "NVIDIA A100-SXM4-80GB", "nvidia", "8.0")),
		"H100, driver 580":                         testenv.H100("580.82.07", "13.0"),
		"H100, driver 575":                         testenv.H100("575.57.08", "12.9"),
		"H100 (tesla), driver 570":                 simNode("570.86.15", "12.8", simGPU(0, "NVIDIA H100 80GB HBM3", "tesla", "9.0")),
		"RTX 4090 (geforce), driver 575":           simNode("575.57.08", "12.9", simGPU(0, "NVIDIA GeForce RTX 4090", "geforce", "8.9")),
		"L4, driver 550":                           simNode("550.54.15", "12.4", simGPU(0, "NVIDIA L4", "nvidia", "8.9")),
		"RTX PRO 6000 (nvidiartx, cc 12.0), 580":   simNode("580.82.07", "13.0", simGPU(0, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "nvidiartx", "12.0")),
		"V100 and H100, driver 580":                simNode("580.82.07", "13.0", simGPU(0, "Tesla V100-SXM2-32GB", "tesla", "7.0"), simGPU(1, "NVIDIA H100 80GB HBM3", "nvidia", "9.0")),
		"H100 of unknown brand, driver 575":        simNode("575.57.08", "12.9", simGPU(0, "NVIDIA H100 80GB HBM3", "", "9.0")),
		"GH200 (arm64), driver 580":                gh200,
		"A100 (tesla), driver 570 (no 535 branch)": simNode("570.86.15", "12.8", simGPU(0, "NVIDIA A100-SXM4-80GB", "tesla", "8.0")),
	}
}

// answer is what a node is told about one variant: comparable across a
// reference and its published copy (the digest, not the repository).
type answer struct {
	Outcome    string
	Candidates []string // variant cuda platform digest
	Rejected   []string // variant: reason
	Warning    string   // of the forced variant
}

func answerOf(f *node.Facts, set *images.Set, variant string) answer {
	p := images.Choose(f, set, images.Override{Kind: images.OverrideAuto})
	a := answer{Outcome: p.Outcome}
	for _, c := range p.Candidates {
		a.Candidates = append(a.Candidates, fmt.Sprintf("%s %s %s %s", c.Variant, c.CUDA, c.Platform, c.Ref[strings.LastIndex(c.Ref, "@")+1:]))
	}
	for _, r := range p.Rejected {
		a.Rejected = append(a.Rejected, r.Variant+": "+r.Reason)
	}
	forced := images.Choose(f, set, images.Override{Kind: images.OverrideVariant, Variant: variant})
	for _, c := range forced.Candidates {
		a.Warning = c.Warning
	}
	return a
}

// pushUpstream pushes env as an unannotated image, as upstream publishes:
// a bare image manifest (alone), or a one-platform index of it.
func pushUpstream(t *testing.T, ref string, env []string, asIndex bool) {
	t.Helper()
	l, err := sandbox.FileLayer(map[string][]byte{"etc/upstream": []byte(ref)})
	if err != nil {
		t.Fatal(err)
	}
	img, err := sandbox.Image(sandbox.ImageSpec{Env: env, Layers: []v1.Layer{l}})
	if err != nil {
		t.Fatal(err)
	}
	if asIndex {
		_, err = sandbox.PushIndex(context.Background(), ref, []sandbox.IndexEntry{{Image: img, Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	} else {
		_, err = sandbox.PushImage(context.Background(), ref, img)
	}
	if err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// Publishing does not change which nodes get an image (issue 10, point 1):
// for every requirement set and every node, the upstream image (its
// metadata derived from its config) and the same child published with
// Publish (its metadata, io.gpupin.cuda.require included, read from the
// index entry) give the same outcome, the same candidates (same digests,
// same order), the same rejections with the same reasons, and the same
// warning when forced — on both registries. Both also agree with the
// requirement set evaluated directly, as libnvidia-container would. The
// published index is resolved without a blob fetch.
func TestPublishedAndUpstreamGiveEveryNodeTheSameAnswerSimulated(t *testing.T) {
	ctx := context.Background()
	configs := requireConfigs()
	nodes := equivalenceNodes()
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			var candidates, rejections int
			for i, rc := range configs {
				upstream := fmt.Sprintf("%s/upstream/e%d:1", reg.Host, i)
				tag := fmt.Sprintf("%s/pub/e%d:1.0", reg.Host, i)
				pushUpstream(t, upstream, rc.env, i%2 == 1)
				if _, err := Publish(ctx, PublishOptions{Tag: tag, Variants: []Variant{{Name: rc.variant, Ref: upstream}}}); err != nil {
					t.Fatalf("%s: publish: %v", rc.name, err)
				}
				res := &images.Resolver{}
				up, err := res.Resolve(ctx, upstream)
				if err != nil {
					t.Fatalf("%s: resolve upstream: %v", rc.name, err)
				}
				if reg.InProcess != nil {
					reg.InProcess.Reset()
				}
				pub, err := res.Resolve(ctx, tag)
				if err != nil {
					t.Fatalf("%s: resolve published: %v", rc.name, err)
				}
				if reg.InProcess != nil {
					if n := reg.InProcess.Count("blob", ""); n != 0 {
						t.Errorf("%s: resolving the published index fetched %d blobs, want none", rc.name, n)
					}
				}
				if len(up.Variants) != 1 || len(pub.Variants) != 1 {
					t.Fatalf("%s: %d upstream and %d published variants, want 1 each", rc.name, len(up.Variants), len(pub.Variants))
				}
				uv, pv := up.Variants[0], pub.Variants[0]
				if !uv.Derived || pv.Derived {
					t.Fatalf("%s: derived upstream %v, published %v: want the upstream derived and the published read from annotations", rc.name, uv.Derived, pv.Derived)
				}
				if pv.Metadata.Require == "" {
					t.Errorf("%s: the published entry carries no %s: %+v", rc.name, images.AnnotationRequire, pv.Metadata)
				}
				if uv.Variant != rc.variant || pv.Variant != rc.variant || uv.Digest != pv.Digest {
					t.Fatalf("%s: upstream %s@%s, published %s@%s, want %s on the same child", rc.name, uv.Variant, uv.Digest, pv.Variant, pv.Digest, rc.variant)
				}
				oracle, err := images.RequirementsFromEnv(rc.env)
				if err != nil {
					t.Fatal(err)
				}
				for nname, f := range nodes {
					ua, pa := answerOf(f, up, rc.variant), answerOf(f, pub, rc.variant)
					if !reflect.DeepEqual(ua, pa) {
						t.Errorf("%s on %s:\n upstream  %+v\n published %+v", rc.name, nname, ua, pa)
					}
					// The toolkit's own rule, for the nodes of the image's platform.
					if f.Platform == "linux/amd64" {
						holds, _ := oracle.Check(f)
						archsOK := images.Reject(f, images.Variant{Metadata: images.Metadata{Variant: rc.variant, CUDA: "1.0", Archs: uv.Archs}}) == ""
						if want := holds && archsOK; (len(pa.Candidates) == 1) != want {
							t.Errorf("%s on %s: candidate %v, but the requirement set holds %v and the archs cover it %v", rc.name, nname, len(pa.Candidates) == 1, holds, archsOK)
						}
					}
					candidates += len(pa.Candidates)
					rejections += len(pa.Rejected)
				}
			}
			if candidates == 0 || rejections == 0 {
				t.Fatalf("%d candidates and %d rejections over the table: it tells nothing apart", candidates, rejections)
			}

			// The two cases, said outright.
			for _, c := range []struct {
				config, node string
				ready        bool
			}{
				{"arch>=8.0", "V100 (tesla, cc 7.0), driver 535", false},
				{"tesla 535 branch", "A100 (tesla), driver 535", true},
				{"main-branch driver, tesla 570 branch", "H100 (tesla), driver 570", true},
			} {
				i := indexOfConfig(configs, c.config)
				for _, ref := range []string{fmt.Sprintf("%s/upstream/e%d:1", reg.Host, i), fmt.Sprintf("%s/pub/e%d:1.0", reg.Host, i)} {
					set, err := (&images.Resolver{}).Resolve(ctx, ref)
					if err != nil {
						t.Fatal(err)
					}
					p := images.Choose(nodes[c.node], set, images.Override{Kind: images.OverrideAuto})
					if got := p.Outcome == images.OutcomeReady; got != c.ready {
						t.Errorf("%s (%s) on %s: outcome %s %+v, want ready %v", ref, c.config, c.node, p.Outcome, p.Rejected, c.ready)
					}
				}
			}
		})
	}
}

func indexOfConfig(cs []requireConfig, name string) int {
	for i, c := range cs {
		if c.name == name {
			return i
		}
	}
	panic("no config " + name)
}
