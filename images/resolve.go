package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	cimages "github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/registry"
)

// Limits on what a registry may send: metadata is small, and a registry that
// sends more is broken or hostile.
const (
	MaxManifestBytes = registry.MaxManifestBytes
	MaxIndexEntries  = 256
	maxConfigBytes   = 8 << 20
)

// Remote is how the resolver reaches registries: the node's registry
// policy, the same one pulls go through (registry.Policy).
type Remote interface {
	Resolver(ctx context.Context) remotes.Resolver
	Explain(err error, host string) error
}

// Resolver reads references from registries, manifests only.
type Resolver struct {
	// Remote reaches the registries; nil means registry.New's defaults
	// (no certs.d, plain HTTP for loopback only, the Docker config).
	Remote Remote
}

// Set is what a reference holds: its variants for every platform, in the
// index's order (the publisher's preference).
type Set struct {
	Ref       string    `json:"ref"`
	Repo      string    `json:"repo"`
	Digest    string    `json:"digest"`
	MediaType string    `json:"media_type"`
	Variants  []Variant `json:"variants"`
}

// Variant is one runnable image: a variant for one platform.
type Variant struct {
	Metadata
	Ref       string `json:"ref"` // repo@sha256:…, what gets pulled
	Digest    string `json:"digest"`
	MediaType string `json:"media_type"`
	Platform  string `json:"platform"`
	// Derived is true when the metadata came from the image config, not
	// from gpupin's annotations.
	Derived bool `json:"derived"`
	// Invalid says why an entry's metadata could not be read; such an
	// entry is only ever a rejection.
	Invalid string `json:"invalid,omitempty"`
	// Require is the image's NVIDIA_REQUIRE_* set: from its config when
	// derived, from io.gpupin.cuda.require when published. nil when the
	// entry carries none (an older publish) or the image disabled it.
	Require *Requirements `json:"-"`
	// RequireDisabled is true when the image sets NVIDIA_DISABLE_REQUIRE:
	// its CUDA requirement is not checked.
	RequireDisabled bool `json:"require_disabled,omitempty"`
}

func (r *Resolver) remote() Remote {
	if r.Remote != nil {
		return r.Remote
	}
	return registry.New(registry.Config{})
}

// fetcher reads manifests and configs of one repository, each checked
// against its descriptor's digest and bounded in size.
type fetcher struct {
	f remotes.Fetcher
}

func (f fetcher) read(ctx context.Context, d ocispec.Descriptor, limit int64) ([]byte, error) {
	if d.Size > limit {
		return nil, fmt.Errorf("%s: %d bytes, more than gpupin's limit of %d", d.Digest, d.Size, limit)
	}
	if err := d.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("digest %q: %w", d.Digest, err)
	}
	rc, err := f.f.Fetch(ctx, d)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.Digest, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than gpupin's limit of %d bytes", d.Digest, limit)
	}
	if got := d.Digest.Algorithm().FromBytes(b); got != d.Digest {
		return nil, fmt.Errorf("registry sent content of digest %s for %s: refusing it", got, d.Digest)
	}
	if d.Size > 0 && int64(len(b)) != d.Size {
		return nil, fmt.Errorf("%s: registry sent %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b, nil
}

// Resolve parses ref and reads it down to its variants (ResolveReference).
func (r *Resolver) Resolve(ctx context.Context, ref string) (*Set, error) {
	pr, err := ParseReference(ref)
	if err != nil {
		return nil, err
	}
	return r.ResolveReference(ctx, pr)
}

// ResolveReference reads a parsed reference down to its variants, for
// callers that parsed it once already. It fetches manifests and, only for
// images without gpupin's annotations, their config blobs; never a layer.
func (r *Resolver) ResolveReference(ctx context.Context, pr Reference) (*Set, error) {
	if pr.named == nil {
		return nil, fmt.Errorf("empty image reference")
	}
	ref := pr.given
	if ref == "" {
		ref = pr.String()
	}
	remote := r.remote()
	fail := func(err error) (*Set, error) {
		return nil, remote.Explain(fmt.Errorf("resolve %s: %w", ref, err), pr.Host())
	}
	rr := remote.Resolver(ctx)
	name, desc, err := rr.Resolve(ctx, pr.String())
	if err != nil {
		return fail(err)
	}
	rf, err := rr.Fetcher(ctx, name)
	if err != nil {
		return fail(err)
	}
	f := fetcher{rf}
	raw, err := f.read(ctx, desc, MaxManifestBytes)
	if err != nil {
		return fail(err)
	}
	set := &Set{Ref: ref, Repo: pr.Repo(), Digest: desc.Digest.String(), MediaType: desc.MediaType}
	switch kind, err := contentKind(desc.MediaType, raw); {
	case err != nil:
		return nil, fmt.Errorf("resolve %s: %w", ref, err)
	case kind == kindIndex:
		var idx ocispec.Index
		if err := json.Unmarshal(raw, &idx); err != nil {
			return nil, fmt.Errorf("resolve %s: index: %w", ref, err)
		}
		if len(idx.Manifests) > MaxIndexEntries {
			return nil, fmt.Errorf("resolve %s: index has %d entries, more than %d", ref, len(idx.Manifests), MaxIndexEntries)
		}
		for i, d := range idx.Manifests {
			if d.Digest == desc.Digest {
				return nil, fmt.Errorf("resolve %s: index entry %d refers to the index itself", ref, i)
			}
			if cimages.IsIndexType(d.MediaType) {
				return nil, fmt.Errorf("resolve %s: index entry %d is itself an index (nested indexes are not variants)", ref, i)
			}
			if !cimages.IsManifestType(d.MediaType) {
				continue // attestations, signatures
			}
			if d.Platform != nil && d.Platform.OS == "unknown" {
				continue // buildx attestation manifests
			}
			v, err := r.entry(ctx, f, pr, d)
			var bad *metadataError
			if errors.As(err, &bad) {
				// One bad entry (another platform's, say) must not make the
				// good ones unusable: it becomes a rejection with its reason.
				set.Variants = append(set.Variants, Variant{Ref: pr.AtDigest(d.Digest.String()), Digest: d.Digest.String(),
					MediaType: d.MediaType, Platform: platformString(d.Platform), Metadata: Metadata{Variant: fmt.Sprintf("entry %d", i)},
					Invalid: fmt.Sprintf("entry %d (%s): %v", i, d.Digest, err)})
				continue
			}
			if err != nil {
				return fail(fmt.Errorf("entry %d (%s): %w", i, d.Digest, err))
			}
			set.Variants = append(set.Variants, v)
		}
		var invalid []string
		for _, v := range set.Variants {
			if v.Invalid != "" {
				invalid = append(invalid, v.Invalid)
			}
		}
		if len(invalid) > 0 && len(invalid) == len(set.Variants) {
			return nil, fmt.Errorf("resolve %s: no entry has usable metadata: %s", ref, strings.Join(invalid, "; "))
		}
	default:
		var m ocispec.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("resolve %s: manifest: %w", ref, err)
		}
		d := ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size, Annotations: m.Annotations}
		v, err := r.fromImage(ctx, f, pr, d, m)
		var bad *metadataError
		if errors.As(err, &bad) {
			return nil, fmt.Errorf("resolve %s: %w", ref, err)
		}
		if err != nil {
			return fail(err)
		}
		set.Variants = append(set.Variants, v)
	}
	if len(set.Variants) == 0 {
		return nil, fmt.Errorf("resolve %s: no image manifests in the index", ref)
	}
	return set, nil
}

type kind int

const (
	kindImage kind = iota
	kindIndex
)

// contentKind says what a manifest is, from its media type and, where the
// registry's type is missing or generic, its own mediaType field; the two
// must agree, or the registry is lying about what it serves.
func contentKind(mediaType string, raw []byte) (kind, error) {
	var probe struct {
		MediaType string            `json:"mediaType"`
		Manifests json.RawMessage   `json:"manifests"`
		Config    *json.RawMessage  `json:"config"`
		Layers    []json.RawMessage `json:"layers"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return 0, fmt.Errorf("manifest is not JSON: %w", err)
	}
	inner := probe.MediaType
	if inner == "" {
		switch {
		case probe.Manifests != nil:
			inner = ocispec.MediaTypeImageIndex
		case probe.Config != nil:
			inner = ocispec.MediaTypeImageManifest
		}
	}
	outerIndex, outerImage := cimages.IsIndexType(mediaType), cimages.IsManifestType(mediaType)
	innerIndex, innerImage := cimages.IsIndexType(inner), cimages.IsManifestType(inner)
	switch {
	case (outerIndex && innerImage) || (outerImage && innerIndex):
		return 0, fmt.Errorf("served as %s but its content is %s", mediaType, inner)
	case outerIndex || innerIndex:
		return kindIndex, nil
	case outerImage || innerImage:
		return kindImage, nil
	}
	return 0, fmt.Errorf("media type %q is neither an image nor an index", mediaType)
}

// entry reads one index entry: its annotations when present, else the
// child manifest's, else the config.
func (r *Resolver) entry(ctx context.Context, f fetcher, pr Reference, d ocispec.Descriptor) (Variant, error) {
	v := Variant{Ref: pr.AtDigest(d.Digest.String()), Digest: d.Digest.String(), MediaType: d.MediaType, Platform: platformString(d.Platform)}
	if HasMetadata(d.Annotations) {
		md, err := ParseAnnotations(d.Annotations)
		if err != nil {
			return Variant{}, &metadataError{err}
		}
		v.Metadata = md
		v.Require, v.RequireDisabled, _ = md.Requirements()
		return v, nil
	}
	raw, err := f.read(ctx, d, MaxManifestBytes)
	if err != nil {
		return Variant{}, err
	}
	k, err := contentKind(d.MediaType, raw)
	if err != nil {
		return Variant{}, &metadataError{err}
	}
	if k != kindImage {
		return Variant{}, &metadataError{fmt.Errorf("typed as an image manifest, but its content is an index")}
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return Variant{}, &metadataError{fmt.Errorf("manifest: %w", err)}
	}
	d.Annotations = m.Annotations
	return r.fromImage(ctx, f, pr, d, m)
}

// fromImage reads a variant from the manifest's annotations or, failing
// those, derives it from the config. The config blob is fetched only when it
// is needed: to derive metadata, or to learn the platform of an image that
// no index entry describes.
func (r *Resolver) fromImage(ctx context.Context, f fetcher, pr Reference, d ocispec.Descriptor, m ocispec.Manifest) (Variant, error) {
	v := Variant{Ref: pr.AtDigest(d.Digest.String()), Digest: d.Digest.String(), MediaType: d.MediaType, Platform: platformString(d.Platform)}
	annotated := HasMetadata(d.Annotations)
	if annotated {
		md, err := ParseAnnotations(d.Annotations)
		if err != nil {
			return Variant{}, &metadataError{err}
		}
		v.Metadata = md
		v.Require, v.RequireDisabled, _ = md.Requirements()
		if d.Platform != nil {
			return v, nil
		}
	}
	if m.Config.Size > maxConfigBytes {
		return Variant{}, &metadataError{fmt.Errorf("config of %d bytes: more than %d", m.Config.Size, maxConfigBytes)}
	}
	raw, err := f.read(ctx, m.Config, maxConfigBytes)
	if err != nil {
		return Variant{}, fmt.Errorf("config: %w", err)
	}
	var cf ocispec.Image
	if err := json.Unmarshal(raw, &cf); err != nil {
		return Variant{}, &metadataError{fmt.Errorf("config: %w", err)}
	}
	if d.Platform == nil {
		if cf.OS == "" || cf.Architecture == "" {
			return Variant{}, &metadataError{fmt.Errorf("the image config names no os/architecture, so no node can tell whether it runs there: set it (crane mutate --set-platform linux/amd64 IMAGE)")}
		}
		v.Platform = platformString(&ocispec.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant})
	}
	if annotated {
		return v, nil
	}
	md, req, err := DeriveMetadata(cf.Config.Env, cf.Config.Labels)
	if err != nil {
		return Variant{}, &metadataError{err}
	}
	v.Metadata, v.Require, v.Derived = md, req, true
	v.RequireDisabled = req == nil
	return v, nil
}

// DeriveMetadata reads what an image without gpupin's annotations can tell:
// CUDA_VERSION, NVIDIA_REQUIRE_*, TORCH_CUDA_ARCH_LIST, and gpupin labels.
func DeriveMetadata(env []string, labels map[string]string) (Metadata, *Requirements, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, val, _ := strings.Cut(kv, "=")
		vars[k] = val
	}
	req, err := RequirementsFromEnv(env)
	if err != nil {
		return Metadata{}, nil, err
	}
	cv := vars["CUDA_VERSION"]
	if cv == "" {
		// An image built on another base may still state its CUDA in
		// NVIDIA_REQUIRE_CUDA (cuda>=X); that is the version it needs.
		cv = req.MinCUDA()
	}
	if cv == "" {
		return Metadata{}, nil, errors.New("no gpupin annotations, no CUDA_VERSION and no cuda>= in NVIDIA_REQUIRE_CUDA in the image config: cannot tell which CUDA it needs")
	}
	ver, err := ParseCUDAVersion(cv)
	if err != nil {
		return Metadata{}, nil, fmt.Errorf("CUDA_VERSION: %w", err)
	}
	md := Metadata{Variant: VariantNameForCUDA(ver), CUDA: ver}
	if a := labels[AnnotationArchs]; a != "" {
		md.Archs = a
	} else if a := vars["TORCH_CUDA_ARCH_LIST"]; a != "" {
		md.Archs = a
	}
	if md.Archs != "" {
		if _, err := ParseArchs(md.Archs); err != nil {
			return Metadata{}, nil, fmt.Errorf("arch list %q: %w", md.Archs, err)
		}
	}
	md.Probe = labels[AnnotationProbe]
	md.ProbeExec = labels[AnnotationProbeExec]
	md.Engine = labels[AnnotationEngine]
	md.EngineVersion = labels[AnnotationEngineVersion]
	if err := md.Validate(); err != nil {
		return Metadata{}, nil, err
	}
	return md, req, nil
}

// ParseCUDAVersion reduces "12.9.1" to "12.9".
func ParseCUDAVersion(s string) (string, error) {
	v, err := node.ParseVersion(s)
	if err != nil {
		return "", err
	}
	return majorMinor(v), nil
}

// VariantNameForCUDA names the variant of a CUDA version as publishers do:
// 13.0 → cu13, 12.9 → cu129.
func VariantNameForCUDA(mm string) string {
	maj, min, _ := strings.Cut(mm, ".")
	if min == "0" || min == "" {
		return "cu" + maj
	}
	return "cu" + maj + min
}

func platformString(p *ocispec.Platform) string {
	if p == nil {
		return ""
	}
	return platforms.Format(*p)
}

// PlatformMatches reports whether an entry's platform runs on the node's.
// An entry without a platform is taken to match: old single-platform indexes.
func PlatformMatches(entry, nodePlatform string) bool {
	if entry == "" {
		return true
	}
	want, err := platforms.Parse(nodePlatform)
	if err != nil {
		return false
	}
	have, err := platforms.Parse(entry)
	if err != nil {
		return false
	}
	return platforms.OnlyStrict(want).Match(have)
}

// metadataError is an entry whose metadata cannot be read: the registry
// answered, but what it holds is malformed.
type metadataError struct{ err error }

func (e *metadataError) Error() string { return e.err.Error() }
func (e *metadataError) Unwrap() error { return e.err }
