package sandbox

import (
	"context"
	"fmt"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
)

// EngineVariant is one variant of a test engine.
type EngineVariant struct {
	Name  string // cu13
	CUDA  string // 13.0
	Archs string // 7.5,8.0,9.0+PTX
	// SimProbe sets GPUPIN_SIM_PROBE in the image: "fail", "hang", "garbled", …
	SimProbe string
	Env      []string
	Layers   []v1.Layer
	Arch     string // platform architecture, default amd64
	// NoAnnotations publishes the entry bare, so its metadata is derived.
	NoAnnotations bool
	// Entrypoint is the image's entrypoint; default none, so Cmd (an echo)
	// runs. A pod's args replace Cmd: an engine a pod passes arguments to
	// needs one.
	Entrypoint []string
}

// PublishEngine pushes one image per variant and an index of them under
// host/engine:version with gpupin's annotations, plus an alias tag per
// variant. It returns the index digest. opts are PushIndex's.
func PublishEngine(ctx context.Context, host, engine, version string, variants []EngineVariant, opts ...remote.Option) (v1.Hash, error) {
	return PublishEngineAs(ctx, host+"/"+engine, engine, version, variants, opts...)
}

// PublishEngineAs is PublishEngine into the repository repo (host/path),
// whose last element need not be the engine's name: repo:version, with
// metadata naming engine:version.
func PublishEngineAs(ctx context.Context, repo, engine, version string, variants []EngineVariant, opts ...remote.Option) (v1.Hash, error) {
	var vs []Variant
	for _, v := range variants {
		env := append([]string{"CUDA_VERSION=" + v.CUDA + ".0"}, v.Env...)
		// On a simulated node the image's own probe would run; these
		// busybox images have none that works, so the emulator answers.
		mode := v.SimProbe
		if mode == "" {
			mode = "emulate"
		}
		env = append(env, "GPUPIN_SIM_PROBE="+mode)
		md := images.Metadata{Engine: engine, EngineVersion: version, Variant: v.Name, CUDA: v.CUDA, Archs: v.Archs, Probe: "cuda"}
		spec := ImageSpec{Env: env, Arch: v.Arch, Layers: v.Layers, Entrypoint: v.Entrypoint, Cmd: []string{"/bin/sh", "-c", "echo engine " + engine + " " + v.Name}}
		if !v.NoAnnotations {
			spec.Annotations = md.Annotations()
		}
		img, err := Image(spec)
		if err != nil {
			return v1.Hash{}, err
		}
		vs = append(vs, Variant{Image: img, Meta: md, Bare: v.NoAnnotations, Arch: v.Arch})
		if _, err := PushImage(ctx, fmt.Sprintf("%s:%s-%s", repo, version, v.Name), img, opts...); err != nil {
			return v1.Hash{}, fmt.Errorf("push the alias tag of %s: %w", v.Name, err)
		}
	}
	return PublishVariants(ctx, fmt.Sprintf("%s:%s", repo, version), vs, opts...)
}

// MustPublishEngineAs is PublishEngineAs for a test: it fails t on an
// error and returns the tag, repo:version.
func MustPublishEngineAs(t testing.TB, repo, engine, version string, variants ...EngineVariant) string {
	t.Helper()
	if _, err := PublishEngineAs(context.Background(), repo, engine, version, variants); err != nil {
		t.Fatalf("publish %s:%s: %v", repo, version, err)
	}
	return repo + ":" + version
}

// Variant is one child of a published test index: an image, and the
// gpupin metadata its index entry is annotated with.
type Variant struct {
	Image v1.Image
	Meta  images.Metadata
	// Bare annotates nothing, as an upstream image: its metadata is derived.
	Bare bool
	Arch string // platform architecture, default amd64
}

// PublishVariants pushes vs and an OCI index of them under ref
// (host/repo:tag), in order, each entry annotated as gpupin publish
// annotates it; it returns the index digest. Every test that publishes
// variants goes through here (PublishEngine too). opts are PushIndex's.
func PublishVariants(ctx context.Context, ref string, vs []Variant, opts ...remote.Option) (v1.Hash, error) {
	entries := make([]IndexEntry, 0, len(vs))
	for _, v := range vs {
		var ann map[string]string
		if !v.Bare {
			ann = v.Meta.Annotations()
		}
		arch := v.Arch
		if arch == "" {
			arch = "amd64"
		}
		entries = append(entries, IndexEntry{Image: v.Image, Annotations: ann, Platform: &v1.Platform{OS: "linux", Architecture: arch}})
	}
	d, err := PushIndex(ctx, ref, entries, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("publish %s: %w", ref, err)
	}
	return d, nil
}

// Publish is PublishVariants for a test: it fails t on an error and
// returns ref.
func Publish(t testing.TB, ref string, vs ...Variant) string {
	t.Helper()
	if _, err := PublishVariants(context.Background(), ref, vs); err != nil {
		t.Fatal(err)
	}
	return ref
}
