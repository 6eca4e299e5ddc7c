package images

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/containerd/platforms"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/node"
)

// Limits on what a registry may send: metadata is small, and a registry that
// sends more is broken or hostile.
const (
	MaxManifestBytes = 4 << 20
	MaxIndexEntries  = 256
	maxConfigBytes   = 8 << 20
)

// Resolver reads references from registries, manifests only.
type Resolver struct {
	// Insecure names registries reached over plain HTTP (host[:port]).
	Insecure []string
	// Keychain gives credentials; nil means the Docker config keychain.
	Keychain authn.Keychain
	// Transport carries the requests; nil means http.DefaultTransport.
	Transport http.RoundTripper
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
	Ref      string `json:"ref"` // repo@sha256:…, what gets pulled
	Digest   string `json:"digest"`
	Platform string `json:"platform"`
	// Derived is true when the metadata came from the image config, not
	// from gpupin's annotations.
	Derived bool `json:"derived"`
	// Invalid says why an entry's metadata could not be read; such an
	// entry is only ever a rejection.
	Invalid string        `json:"invalid,omitempty"`
	Require *Requirements `json:"-"`
	// RequireDisabled is true for a derived variant whose image sets
	// NVIDIA_DISABLE_REQUIRE: its CUDA requirement is not checked.
	RequireDisabled bool `json:"require_disabled,omitempty"`
}

func (r *Resolver) options(ctx context.Context) []remote.Option {
	kc := r.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	tr := r.Transport
	if tr == nil {
		tr = remote.DefaultTransport
	}
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(&limitTransport{next: tr}),
		remote.WithUserAgent("gpupin"),
	}
}

// Resolve reads a reference down to its variants. It fetches manifests and,
// only for images without gpupin's annotations, their config blobs; never a
// layer.
func (r *Resolver) Resolve(ctx context.Context, ref string) (*Set, error) {
	nref, err := ParseReference(ref, r.Insecure)
	if err != nil {
		return nil, err
	}
	opts := r.options(ctx)
	desc, err := remote.Get(nref, opts...)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", ref, err)
	}
	repo := nref.Context()
	set := &Set{Ref: ref, Repo: repo.Name(), Digest: desc.Digest.String(), MediaType: string(desc.MediaType)}
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", ref, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("resolve %s: index: %w", ref, err)
		}
		if len(im.Manifests) > MaxIndexEntries {
			return nil, fmt.Errorf("resolve %s: index has %d entries, more than %d", ref, len(im.Manifests), MaxIndexEntries)
		}
		for i, d := range im.Manifests {
			if d.Digest == desc.Digest {
				return nil, fmt.Errorf("resolve %s: index entry %d refers to the index itself", ref, i)
			}
			if d.MediaType.IsIndex() {
				return nil, fmt.Errorf("resolve %s: index entry %d is itself an index (nested indexes are not variants)", ref, i)
			}
			if !d.MediaType.IsImage() {
				continue // attestations, signatures
			}
			if d.Platform != nil && d.Platform.OS == "unknown" {
				continue // buildx attestation manifests
			}
			v, err := r.entry(ctx, repo, d, opts)
			var bad *metadataError
			if errors.As(err, &bad) {
				// One bad entry (another platform's, say) must not make the
				// good ones unusable: it becomes a rejection with its reason.
				set.Variants = append(set.Variants, Variant{Ref: repo.Digest(d.Digest.String()).Name(), Digest: d.Digest.String(),
					Platform: platformString(d.Platform), Metadata: Metadata{Variant: fmt.Sprintf("entry %d", i)},
					Invalid: fmt.Sprintf("entry %d (%s): %v", i, d.Digest, err)})
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("resolve %s: entry %d (%s): %w", ref, i, d.Digest, err)
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
	case desc.MediaType.IsImage():
		img, err := desc.Image()
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", ref, err)
		}
		m, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("resolve %s: manifest: %w", ref, err)
		}
		d := v1.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size, Annotations: m.Annotations}
		v, err := r.fromImage(repo, d, img)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", ref, err)
		}
		set.Variants = append(set.Variants, v)
	default:
		return nil, fmt.Errorf("resolve %s: media type %q is neither an image nor an index", ref, desc.MediaType)
	}
	if len(set.Variants) == 0 {
		return nil, fmt.Errorf("resolve %s: no image manifests in the index", ref)
	}
	return set, nil
}

// entry reads one index entry: its annotations when present, else the
// child manifest's, else the config.
func (r *Resolver) entry(ctx context.Context, repo name.Repository, d v1.Descriptor, opts []remote.Option) (Variant, error) {
	v := Variant{Ref: repo.Digest(d.Digest.String()).Name(), Digest: d.Digest.String(), Platform: platformString(d.Platform)}
	if HasMetadata(d.Annotations) {
		m, err := ParseAnnotations(d.Annotations)
		if err != nil {
			return Variant{}, &metadataError{err}
		}
		v.Metadata = m
		return v, nil
	}
	img, err := remote.Image(repo.Digest(d.Digest.String()), opts...)
	if err != nil {
		return Variant{}, err
	}
	m, err := img.Manifest()
	if err != nil {
		return Variant{}, fmt.Errorf("manifest: %w", err)
	}
	d.Annotations = m.Annotations
	return r.fromImage(repo, d, img)
}

// fromImage reads a variant from the manifest's annotations or, failing
// those, derives it from the config. The config blob is fetched only when it
// is needed: to derive metadata, or to learn the platform of an image that
// no index entry describes.
func (r *Resolver) fromImage(repo name.Repository, d v1.Descriptor, img v1.Image) (Variant, error) {
	v := Variant{Ref: repo.Digest(d.Digest.String()).Name(), Digest: d.Digest.String(), Platform: platformString(d.Platform)}
	annotated := HasMetadata(d.Annotations)
	if annotated {
		md, err := ParseAnnotations(d.Annotations)
		if err != nil {
			return Variant{}, &metadataError{err}
		}
		v.Metadata = md
		if d.Platform != nil {
			return v, nil
		}
	}
	m, err := img.Manifest()
	if err != nil {
		return Variant{}, err
	}
	if m.Config.Size > maxConfigBytes {
		return Variant{}, &metadataError{fmt.Errorf("config of %d bytes: more than %d", m.Config.Size, maxConfigBytes)}
	}
	cf, err := img.ConfigFile()
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	if errors.As(err, &se) || errors.As(err, &te) {
		return Variant{}, &metadataError{fmt.Errorf("config: %w", err)}
	}
	if err != nil {
		return Variant{}, fmt.Errorf("config: %w", err)
	}
	if d.Platform == nil && cf.OS != "" {
		v.Platform = platformString(&v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant})
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

func platformString(p *v1.Platform) string {
	if p == nil {
		return ""
	}
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
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

// limitTransport refuses manifests larger than MaxManifestBytes before they
// are read into memory.
type limitTransport struct{ next http.RoundTripper }

func (t *limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || !strings.Contains(req.URL.Path, "/manifests/") || req.Method != http.MethodGet {
		return resp, err
	}
	if resp.ContentLength > MaxManifestBytes {
		resp.Body.Close()
		return nil, fmt.Errorf("manifest %s: %d bytes, more than gpupin's limit of %d", req.URL.Path, resp.ContentLength, MaxManifestBytes)
	}
	resp.Body = &limitedBody{rc: resp.Body, left: MaxManifestBytes, path: req.URL.Path}
	return resp, nil
}

type limitedBody struct {
	rc   io.ReadCloser
	left int64
	path string
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("manifest %s: more than gpupin's limit of %d bytes", b.path, MaxManifestBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
