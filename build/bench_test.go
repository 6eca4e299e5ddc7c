package build

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/internal/sandbox"
)

// BenchmarkPublish publishes 2 variants × 2 platforms whose layers (about
// GPUPIN_BENCH_BYTES, default 2 GiB, on disk) are already in the registry,
// beside crane doing the nearest equivalent: index append for each alias and
// the tag, then reading the tag back. crane cannot annotate entries (and
// `crane mutate` refuses indexes), so it does less. Each iteration
// publishes a new version:
//
//	samerepo:  the CI images are in the target repository (children exist)
//	otherrepo: they are in another repository of the same registry, and the
//	           target repository is new (children and blobs are checked)
//
// Run with bench/publish.sh, or:
//
//	go test -run '^$' -bench BenchmarkPublish -benchtime 5x ./build/
func BenchmarkPublish(b *testing.B) {
	total := int64(2 << 30)
	if s := os.Getenv("GPUPIN_BENCH_BYTES"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("GPUPIN_BENCH_BYTES=%q: %v", s, err)
		}
		total = n
	}
	crane, err := exec.LookPath("crane")
	if err != nil {
		if p := os.ExpandEnv("$HOME/go/bin/crane"); fileExists(p) {
			crane = p
		} else {
			b.Fatalf("crane not found: go install github.com/google/go-containerregistry/cmd/crane@v0.22.1")
		}
	}
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{BlobDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	ctx := context.Background()
	srcs := map[string]string{}
	for _, repo := range []string{"org/vllm", "ci/vllm"} {
		for vi, v := range []struct{ name, cuda string }{{"cu13", "13.0.1"}, {"cu129", "12.9.1"}} {
			ref := fmt.Sprintf("%s/%s:ci-%s", reg.Host, repo, v.name)
			// Same seed per variant and platform: both repositories hold the
			// same blobs, as the registry stores them once.
			if err := seedVariant(ctx, ref, v.cuda, total/4, uint64(vi)); err != nil {
				b.Fatal(err)
			}
			srcs[repo+"/"+v.name] = ref
		}
	}
	b.Logf("seeded %d MiB of layers per repository", total>>20)

	for _, sc := range []struct{ name, srcRepo string }{{"samerepo", "org/vllm"}, {"otherrepo", "ci/vllm"}} {
		target := func(i int, tool string) (repo, version string) {
			if sc.srcRepo == "org/vllm" {
				return reg.Host + "/org/vllm", fmt.Sprintf("%s-%d", tool, i)
			}
			return fmt.Sprintf("%s/pub-%s-%d/vllm", reg.Host, tool, i), "1.0"
		}
		b.Run(sc.name+"/gpupin", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				repo, version := target(i, "gpupin")
				_, err := Publish(ctx, PublishOptions{Tag: repo + ":" + version, Engine: "vllm", Variants: []Variant{
					{Name: "cu13", Ref: srcs[sc.srcRepo+"/cu13"]}, {Name: "cu129", Ref: srcs[sc.srcRepo+"/cu129"]}}})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		// The CLI too, when bench/publish.sh built it: crane runs as a
		// process, so this is the like-for-like comparison.
		if bin := os.Getenv("GPUPIN_BIN"); bin != "" {
			b.Run(sc.name+"/gpupin-cli", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					repo, version := target(i, "gpupincli")
					out, err := exec.Command(bin, "publish", "--tag", repo+":"+version, "--engine", "vllm",
						"--variant", "cu13="+srcs[sc.srcRepo+"/cu13"], "--variant", "cu129="+srcs[sc.srcRepo+"/cu129"]).CombinedOutput()
					if err != nil {
						b.Fatalf("gpupin publish: %v\n%s", err, out)
					}
				}
			})
		}
		b.Run(sc.name+"/crane", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				repo, version := target(i, "crane")
				tag := repo + ":" + version
				cmds := [][]string{
					{"index", "append", "-m", srcs[sc.srcRepo+"/cu129"], "-t", tag + "-cu129"},
					{"index", "append", "-m", srcs[sc.srcRepo+"/cu13"], "-t", tag + "-cu13"},
					{"index", "append", "-m", srcs[sc.srcRepo+"/cu129"], "-m", srcs[sc.srcRepo+"/cu13"], "-t", tag},
					// Read back, as publish verifies.
					{"manifest", tag},
				}
				for _, c := range cmds {
					out, err := exec.Command(crane, c...).CombinedOutput()
					if err != nil {
						b.Fatalf("crane %v: %v\n%s", c, err, out)
					}
				}
			}
		})
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// seedVariant pushes a two-platform index of images of two layers each,
// size bytes per image, with pseudo-random (incompressible) content. The
// layers are static blobs, not gzipped here: the registry does not care,
// and gzip would make seeding take minutes.
func seedVariant(ctx context.Context, ref, cuda string, size int64, seed uint64) error {
	tag, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	var adds []mutate.IndexAddendum
	for pi, arch := range []string{"amd64", "arm64"} {
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		for li := 0; li < 2; li++ {
			data := make([]byte, size/2)
			r := rand.NewChaCha8([32]byte{byte(seed), byte(pi), byte(li)})
			r.Read(data)
			l := static.NewLayer(data, types.OCILayer)
			if err := remote.WriteLayer(tag.Context(), l, remote.WithContext(ctx)); err != nil {
				return err
			}
			if img, err = mutate.AppendLayers(img, l); err != nil {
				return err
			}
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		cf.Config.Env = []string{"CUDA_VERSION=" + cuda}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}
		if err := remote.Write(tag.Context().Digest(mustDigest(img)), img, remote.WithContext(ctx)); err != nil {
			return err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	return remote.WriteIndex(tag, idx, remote.WithContext(ctx))
}

func mustDigest(img v1.Image) string {
	d, err := img.Digest()
	if err != nil {
		panic(err)
	}
	return d.String()
}
