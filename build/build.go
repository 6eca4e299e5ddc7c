package build

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/registry"
)

// BuildOptions say what to do with a spec.
type BuildOptions struct {
	Spec *Spec
	// Epoch stamps every timestamp; nil means SOURCE_DATE_EPOCH, else 0.
	Epoch *time.Time
	// Output, when set, is a directory to write an OCI layout to.
	Output string
	// Push publishes to Spec.Repository:Spec.Version, as Publish does.
	Push bool
	// AllowPartialPlatforms is Publish's option of that name.
	AllowPartialPlatforms bool
	// Annotations go on the index and every entry, as with Publish.
	Annotations map[string]string
	// Registry is Publish's option of that name: how the bases are read
	// and the result pushed.
	Registry *registry.Policy
	// Compression encodes the layers: gpupin's own as asked, and the
	// base's re-encoded to match (Publish's option of that name).
	Compression Compression
	// BeforeTag is Publish's option of that name: run after every
	// manifest is pushed by digest, before the tags (signing).
	BeforeTag func(ctx context.Context, res *Result) error
}

// BuiltImage is one variant image for one platform.
type BuiltImage struct {
	Variant  string   `json:"variant"`
	Platform string   `json:"platform"`
	Digest   string   `json:"digest"`
	Layers   []string `json:"layers"`
}

// BuildResult is what Build made.
type BuildResult struct {
	Images []BuiltImage `json:"images"`
	// Index is the digest of the index (with gpupin's annotations) that
	// --output wrote and --push published.
	Index   string  `json:"index"`
	Output  string  `json:"output,omitempty"`
	Publish *Result `json:"publish,omitempty"`
}

// epochFromEnv reads SOURCE_DATE_EPOCH (seconds); unset means 0.
func epochFromEnv() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// Build assembles every variant's images without a Docker engine, then
// writes an OCI layout and/or publishes them.
func Build(ctx context.Context, opts BuildOptions) (*BuildResult, error) {
	s := opts.Spec
	if s == nil {
		return nil, fmt.Errorf("build: no spec")
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if opts.Push && s.Repository == "" {
		return nil, fmt.Errorf("repository: required to push")
	}
	var epoch time.Time
	if opts.Epoch != nil {
		epoch = opts.Epoch.UTC()
	} else {
		e, err := epochFromEnv()
		if err != nil {
			return nil, err
		}
		epoch = e
	}
	popts := PublishOptions{
		Tag:                   s.Repository + ":" + s.Version,
		Engine:                s.Engine,
		Annotations:           opts.Annotations,
		AllowPartialPlatforms: opts.AllowPartialPlatforms,
		Registry:              opts.Registry,
		Compression:           opts.Compression,
		BeforeTag:             opts.BeforeTag,
	}
	popts.Registry = popts.policy()
	if s.Repository == "" {
		// Only names the alias tags inside the plan; nothing is pushed.
		popts.Tag = "localhost/" + s.Engine + ":" + s.Version
	}
	ropts := remoteOptions(ctx, popts)
	res := &BuildResult{}
	for i, vs := range s.Variants {
		v := Variant{Name: vs.Name, Archs: vs.Archs}
		for _, ps := range vs.Platforms {
			img, err := buildImage(s, vs, ps, epoch, opts.Compression, ropts)
			if err != nil {
				return nil, fmt.Errorf("variants[%d] (%s, %s): %w", i, vs.Name, ps, err)
			}
			v.Images = append(v.Images, img)
		}
		popts.Variants = append(popts.Variants, v)
	}
	p, err := makePlan(ctx, popts)
	if err != nil {
		return nil, err
	}
	defer p.close()
	d, err := p.index.Digest()
	if err != nil {
		return nil, fmt.Errorf("index digest: %w", err)
	}
	res.Index = d.String()
	for _, c := range p.children {
		bi, err := describeBuilt(c)
		if err != nil {
			return nil, err
		}
		res.Images = append(res.Images, bi)
	}
	for i := range res.Images {
		res.Images[i].Variant, res.Images[i].Platform = p.entries[i].Variant, p.entries[i].Platform
	}
	if opts.Output != "" {
		if err := writeLayout(opts.Output, p); err != nil {
			return nil, fmt.Errorf("output %s: %w", opts.Output, err)
		}
		res.Output = opts.Output
	}
	if opts.Push {
		pr, err := p.result(false)
		if err != nil {
			return nil, err
		}
		if err := p.push(ctx, popts, pr); err != nil {
			return nil, err
		}
		pr.Verified = true
		res.Publish = pr
	}
	return res, nil
}

func describeBuilt(img v1.Image) (BuiltImage, error) {
	d, err := img.Digest()
	if err != nil {
		return BuiltImage{}, fmt.Errorf("image digest: %w", err)
	}
	ls, err := img.Layers()
	if err != nil {
		return BuiltImage{}, fmt.Errorf("layers: %w", err)
	}
	bi := BuiltImage{Digest: d.String()}
	for _, l := range ls {
		ld, err := l.Digest()
		if err != nil {
			return BuiltImage{}, fmt.Errorf("layer digest: %w", err)
		}
		bi.Layers = append(bi.Layers, ld.String())
	}
	return bi, nil
}

// writeLayout writes the index (and so every child and blob) to an OCI
// layout, named by the version as `oras`/`skopeo` expect.
func writeLayout(dir string, p *plan) error {
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return lp.AppendIndex(p.index, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": p.version,
	}))
}

// buildImage assembles one variant for one platform, gpupin's own layers
// encoded as comp.
func buildImage(s *Spec, vs VariantSpec, platform string, epoch time.Time, comp Compression, ropts []remote.Option) (v1.Image, error) {
	plat, err := v1.ParsePlatform(platform)
	if err != nil {
		return nil, fmt.Errorf("platform %q: %w", platform, err)
	}
	var base v1.Image
	if vs.Base == "scratch" {
		base = mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	} else {
		ref, err := parseRef(vs.Base)
		if err != nil {
			return nil, fmt.Errorf("base: %w", err)
		}
		base, err = remote.Image(ref, append(ropts, remote.WithPlatform(*plat))...)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", vs.Base, err)
		}
		cf, err := base.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("base %s: config: %w", vs.Base, err)
		}
		// A single-platform base is returned whatever platform was asked.
		if cf.OS != plat.OS || cf.Architecture != plat.Architecture {
			return nil, fmt.Errorf("base %s is %s/%s, not %s", vs.Base, cf.OS, cf.Architecture, platform)
		}
	}
	mt, err := base.MediaType()
	if err != nil {
		return nil, fmt.Errorf("base media type: %w", err)
	}
	lmt := types.OCILayer
	switch {
	case comp == CompressionZstd:
		// Encoded as zstd from the start; the base's layers are re-encoded
		// by the plan, which makes a Docker manifest an OCI one.
		lmt = types.OCILayerZStd
	case mt == types.DockerManifestSchema2:
		lmt = types.DockerLayer
	}
	var adds []mutate.Addendum
	for i, ls := range vs.Layers {
		var l v1.Layer
		var by string
		if ls.Dir != "" {
			l, err = dirLayer(ls.Dir, ls.Dest, epoch, lmt)
			by = "gpupin build: dir " + ls.Dest
		} else {
			l, err = tarLayer(ls.Tar, epoch, lmt)
			by = "gpupin build: tar"
		}
		if err != nil {
			return nil, fmt.Errorf("layers[%d]: %w", i, err)
		}
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: lmt,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: by, Comment: "gpupin build"}})
	}
	img, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant, cf.OSVersion = plat.OS, plat.Architecture, plat.Variant, plat.OSVersion
	cf.Created = v1.Time{Time: epoch}
	env := map[string]string{}
	for k, v := range vs.Env {
		env[k] = v
	}
	if _, ok := env["CUDA_VERSION"]; !ok && !hasEnv(cf.Config.Env, "CUDA_VERSION") {
		env["CUDA_VERSION"] = vs.CUDA
	}
	cf.Config.Env = mergeEnv(cf.Config.Env, env)
	if cv, ok := lookupEnv(cf.Config.Env, "CUDA_VERSION"); ok {
		mm, err := images.ParseCUDAVersion(cv)
		want, _ := images.ParseCUDAVersion(vs.CUDA)
		if err != nil || mm != want {
			return nil, fmt.Errorf("cuda: %s, but the base image sets CUDA_VERSION=%s", vs.CUDA, cv)
		}
	}
	labels := map[string]string{}
	for k, v := range cf.Config.Labels {
		labels[k] = v
	}
	for k, v := range vs.Labels {
		labels[k] = v
	}
	labels[images.AnnotationEngine] = s.Engine
	labels[images.AnnotationEngineVersion] = s.Version
	labels[images.AnnotationVariant] = vs.Name
	if vs.Archs != "" {
		labels[images.AnnotationArchs] = normaliseArchs(vs.Archs)
	}
	cf.Config.Labels = labels
	if vs.Entrypoint != nil {
		cf.Config.Entrypoint = vs.Entrypoint
	}
	if vs.Cmd != nil {
		cf.Config.Cmd = vs.Cmd
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return img, nil
}

func hasEnv(env []string, k string) bool {
	_, ok := lookupEnv(env, k)
	return ok
}

func lookupEnv(env []string, k string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if kk, v, _ := strings.Cut(env[i], "="); kk == k {
			return v, true
		}
	}
	return "", false
}

// mergeEnv keeps the base's order, replaces the keys set, and appends the
// new keys sorted, so the config is the same for the same spec.
func mergeEnv(base []string, set map[string]string) []string {
	out := make([]string, 0, len(base)+len(set))
	done := map[string]bool{}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := set[k]; ok {
			out = append(out, k+"="+v)
			done[k] = true
			continue
		}
		out = append(out, kv)
	}
	var keys []string
	for k := range set {
		if !done[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+set[k])
	}
	return out
}
