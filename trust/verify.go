package trust

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/gpupin/gpupin/containerd"
)

// Where cosign puts signatures.
const (
	// AnnotationSignature carries a classic signature's base64 on its
	// layer in the sha256-<hex>.sig manifest.
	AnnotationSignature = "dev.cosignproject.cosign/signature"
	// BundleArtifactPrefix is the artifactType of a referrer holding a
	// Sigstore bundle (cosign --new-bundle-format, cosign v3's default).
	BundleArtifactPrefix = "application/vnd.dev.sigstore.bundle"
)

// Bounds on what a registry may send for signatures: they are small, and a
// registry that sends more, or stalls, must not hold a provision.
const (
	DefaultMaxBytes = 4 << 20
	DefaultTimeout  = 30 * time.Second
	maxSignatures   = 32
)

// Verifier checks images against a Policy.
type Verifier struct {
	Policy *Policy
	// Transport and Keychain reach registries: the node's registry policy
	// (registry.Policy's), so signatures come over the same TLS, mirrors'
	// hosts.toml and credentials as the rest. nil: Go's defaults.
	Transport http.RoundTripper
	Keychain  authn.Keychain
	// MaxBytes bounds each response body (manifest, layer, bundle).
	MaxBytes int64
	// Timeout bounds all fetches for one image.
	Timeout time.Duration
	// Now stamps the result; tests fix it.
	Now func() time.Time
}

// Error is a refusal: the engine, the variant and why.
type Error struct {
	Engine, Variant, Ref string
	Reason               string
	Err                  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("signature policy refused engine %s variant %s (%s): %s", e.Engine, e.Variant, e.Ref, e.Reason)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrUnsigned is under an Error when no signature at all was found.
var ErrUnsigned = errors.New("no signature")

// Required says whether the policy requires a signature for engine.
func (v *Verifier) Required(engine string) bool {
	return v != nil && v.Policy.For(engine).Mode == ModeRequired
}

// Verify checks ref (repo@sha256:… of a variant's manifest) for engine's
// rule; index, when not empty, is the digest of the index the variant was
// chosen from: a signature over it counts, since the index names the
// manifest by digest. Under mode off it returns nil, nil without fetching.
func (v *Verifier) Verify(ctx context.Context, engine, variant, ref, index string) (*containerd.Signature, error) {
	rule := v.Policy.For(engine)
	if rule.Mode != ModeRequired {
		return nil, nil
	}
	refuse := func(reason string, err error) error {
		return &Error{Engine: engine, Variant: variant, Ref: ref, Reason: reason, Err: err}
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		return nil, refuse("not a digested reference", err)
	}
	timeout := v.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("signature fetch took more than %s", timeout))
	defer cancel()
	digests := []string{d.DigestStr()}
	if index != "" && index != d.DigestStr() {
		digests = append(digests, index)
	}
	var why []string
	for _, dg := range digests {
		by, err := v.verifyDigest(ctx, rule, d.Context(), dg)
		if err == nil {
			now := time.Now
			if v.Now != nil {
				now = v.Now
			}
			return &containerd.Signature{Mode: rule.Mode, By: by, Digest: dg, At: now().UTC()}, nil
		}
		if c := context.Cause(ctx); c != nil {
			return nil, refuse(c.Error(), c)
		}
		why = append(why, dg+": "+err.Error())
		if !errors.Is(err, ErrUnsigned) {
			// A bad signature says more than the other digest's absence.
			return nil, refuse(strings.Join(why, "; "), err)
		}
	}
	return nil, refuse(strings.Join(why, "; "), ErrUnsigned)
}

// verifyDigest finds the signatures over dg in repo and returns who signed
// it, or why none of them passes.
func (v *Verifier) verifyDigest(ctx context.Context, rule Rule, repo name.Repository, dg string) (string, error) {
	h, err := v1.NewHash(dg)
	if err != nil {
		return "", fmt.Errorf("digest %q: %w", dg, err)
	}
	var found int
	var fails []string
	if len(rule.Keys) > 0 {
		n, by, err := v.classic(ctx, rule, repo, h)
		if err == nil && by != "" {
			return by, nil
		}
		found += n
		if err != nil {
			fails = append(fails, err.Error())
		}
	}
	n, by, err := v.bundles(ctx, rule, repo, h)
	if err == nil && by != "" {
		return by, nil
	}
	found += n
	if err != nil {
		fails = append(fails, err.Error())
	}
	if found == 0 && len(fails) == 0 {
		return "", fmt.Errorf("%w: no %s-%s.sig tag and no Sigstore bundle referrer", ErrUnsigned, h.Algorithm, h.Hex)
	}
	if len(fails) == 0 {
		fails = append(fails, "no signature by a trusted key or identity")
	}
	return "", errors.New(strings.Join(fails, "; "))
}

// classic reads cosign's sha256-<hex>.sig tag: a manifest whose layers are
// simple-signing payloads, each with its signature in an annotation.
func (v *Verifier) classic(ctx context.Context, rule Rule, repo name.Repository, h v1.Hash) (int, string, error) {
	tag := repo.Tag(fmt.Sprintf("%s-%s.sig", h.Algorithm, h.Hex))
	raw, err := v.get(ctx, tag)
	if err != nil {
		if isNotFound(err) {
			return 0, "", nil
		}
		return 0, "", fmt.Errorf("signature tag %s: %w", tag.TagStr(), err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return 0, "", fmt.Errorf("signature tag %s: manifest: %w", tag.TagStr(), err)
	}
	if len(m.Layers) > maxSignatures {
		return 0, "", fmt.Errorf("signature tag %s: %d layers, more than gpupin's limit of %d", tag.TagStr(), len(m.Layers), maxSignatures)
	}
	var fails []string
	n := 0
	for _, l := range m.Layers {
		sig64, ok := l.Annotations[AnnotationSignature]
		if !ok {
			continue
		}
		n++
		by, err := v.classicLayer(ctx, rule, repo, h, l, sig64)
		if err == nil {
			return n, by, nil
		}
		fails = append(fails, err.Error())
	}
	if n == 0 {
		return 0, "", fmt.Errorf("signature tag %s: no layer carries %s", tag.TagStr(), AnnotationSignature)
	}
	return n, "", fmt.Errorf("signature tag %s: %s", tag.TagStr(), strings.Join(fails, "; "))
}

func (v *Verifier) classicLayer(ctx context.Context, rule Rule, repo name.Repository, h v1.Hash, l v1.Descriptor, sig64 string) (string, error) {
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil {
		return "", fmt.Errorf("signature annotation is not base64: %w", err)
	}
	body, err := v.blob(ctx, repo, l)
	if err != nil {
		return "", fmt.Errorf("payload %s: %w", l.Digest, err)
	}
	var who string
keys:
	for _, k := range rule.Keys {
		for _, kv := range k.Verifiers {
			if err := kv.VerifySignature(bytes.NewReader(sig), bytes.NewReader(body)); err == nil {
				who = k.Name
				break keys
			}
		}
	}
	if who == "" {
		return "", errors.New("signature by no trusted key")
	}
	// The signature is good; now what it says it signed.
	var p payload.SimpleContainerImage
	if err := json.Unmarshal(body, &p); err != nil {
		return "", fmt.Errorf("%s signed a payload that is not simple signing JSON: %w", who, err)
	}
	if p.Critical.Type != payload.CosignSignatureType {
		return "", fmt.Errorf("%s signed a payload of type %q, not %q", who, p.Critical.Type, payload.CosignSignatureType)
	}
	if p.Critical.Image.DockerManifestDigest != h.String() {
		return "", fmt.Errorf("%s signed digest %s, not %s", who, p.Critical.Image.DockerManifestDigest, h)
	}
	return who, nil
}

// bundles reads the OCI referrers of h that hold Sigstore bundles and
// verifies each with sigstore-go until one passes. A referrer listed with
// a bundle artifactType is one; so is one listed as the empty config's
// media type (or none) whose manifest says it is one: registries that
// report the config's media type instead of the manifest's artifactType
// (go-containerregistry's own, `crane registry serve`) list cosign's
// bundles that way.
func (v *Verifier) bundles(ctx context.Context, rule Rule, repo name.Repository, h v1.Hash) (int, string, error) {
	idx, err := remote.Referrers(repo.Digest(h.String()), v.opts(ctx)...)
	if err != nil {
		if isNotFound(err) {
			return 0, "", nil
		}
		return 0, "", fmt.Errorf("referrers: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return 0, "", fmt.Errorf("referrers: %w", err)
	}
	var fails []string
	n, read := 0, 0
	for _, d := range im.Manifests {
		listed := strings.HasPrefix(d.ArtifactType, BundleArtifactPrefix)
		if !listed && d.ArtifactType != "" && d.ArtifactType != emptyMediaType {
			continue
		}
		if read++; read > maxSignatures {
			break
		}
		m, err := v.referrer(ctx, repo, d)
		if err != nil {
			if listed {
				n++
				fails = append(fails, fmt.Sprintf("bundle %s: %v", d.Digest, err))
			}
			continue
		}
		if !listed && !isBundleManifest(m) {
			continue // another kind of artifact
		}
		n++
		by, err := v.bundle(ctx, rule, repo, h, m)
		if err == nil {
			return n, by, nil
		}
		fails = append(fails, fmt.Sprintf("bundle %s: %v", d.Digest, err))
	}
	if n == 0 {
		return 0, "", nil
	}
	return n, "", errors.New(strings.Join(fails, "; "))
}

// emptyMediaType is the OCI empty descriptor's, the config cosign gives a
// bundle referrer.
const emptyMediaType = "application/vnd.oci.empty.v1+json"

// isBundleManifest: a referrer manifest whose artifactType, or whose one
// layer's media type, is a Sigstore bundle's.
func isBundleManifest(m *v1.Manifest) bool {
	if strings.HasPrefix(m.ArtifactType, BundleArtifactPrefix) {
		return true
	}
	return len(m.Layers) == 1 && strings.HasPrefix(string(m.Layers[0].MediaType), BundleArtifactPrefix)
}

// referrer reads a referrer's manifest, bounded.
func (v *Verifier) referrer(ctx context.Context, repo name.Repository, d v1.Descriptor) (*v1.Manifest, error) {
	raw, err := v.get(ctx, repo.Digest(d.Digest.String()))
	if err != nil {
		return nil, err
	}
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return &m, nil
}

func (v *Verifier) bundle(ctx context.Context, rule Rule, repo name.Repository, h v1.Hash, m *v1.Manifest) (string, error) {
	if len(m.Layers) != 1 {
		return "", fmt.Errorf("%d layers; a bundle referrer has one", len(m.Layers))
	}
	body, err := v.blob(ctx, repo, m.Layers[0])
	if err != nil {
		return "", err
	}
	var b bundle.Bundle
	if err := b.UnmarshalJSON(body); err != nil {
		return "", fmt.Errorf("not a Sigstore bundle: %w", err)
	}
	return VerifyEntity(rule, &b, h)
}

// SignPredicateType is the in-toto predicate type of the statement cosign
// sign puts in a bundle (cosign's types.CosignSignPredicateType): a bundle
// whose DSSE statement is another attestation (provenance, an SBOM, a scan)
// is not a signature of the image, whoever made it.
const SignPredicateType = "https://sigstore.dev/cosign/sign/v1"

// VerifyEntity verifies a Sigstore signed entity (a bundle) over h with
// sigstore-go, against the rule's keys when a public key signed it, else
// against its keyless identities:
//   - a key: the signature over h (a DSSE statement naming h as a subject,
//     or a message signature over h) by one of the rule's keys. No
//     transparency log entry or timestamp is required or checked (as
//     cosign verify --key --insecure-ignore-tlog does; the policy has no
//     option for one), so key-signed bundles verify offline.
//   - keyless: the certificate chains to the trusted root's Fulcio, the
//     transparency log entry is the root's Rekor's, the signing time is
//     one that log observed, and the certificate's issuer and subject are
//     one of the rule's identities.
//
// Either way a DSSE statement must be cosign sign's (SignPredicateType).
func VerifyEntity(rule Rule, e verify.SignedEntity, h v1.Hash) (string, error) {
	raw, err := hex.DecodeString(h.Hex)
	if err != nil {
		return "", fmt.Errorf("digest %s: %w", h, err)
	}
	artifact := verify.WithArtifactDigest(h.Algorithm, raw)
	vc, err := e.VerificationContent()
	if err != nil {
		return "", fmt.Errorf("bundle has no verification material: %w", err)
	}
	if vc.PublicKey() != nil {
		if len(rule.Keys) == 0 {
			return "", errors.New("signed with a key, and the rule names no keys, only keyless identities")
		}
		return verifyKeyed(rule, e, artifact)
	}
	if vc.Certificate() == nil {
		return "", errors.New("bundle has neither a public key nor a certificate")
	}
	if len(rule.Identities) == 0 {
		return "", errors.New("signed keyless (with a certificate), and the rule names no identities, only keys")
	}
	sv, err := verify.NewVerifier(rule.Root, verify.WithTransparencyLog(1), verify.WithObserverTimestamps(1))
	if err != nil {
		return "", fmt.Errorf("trusted root %s: %w", rule.RootPath, err)
	}
	var fails []string
	for _, id := range rule.Identities {
		ci, err := verify.NewShortCertificateIdentity(id.Issuer, "", id.Subject, "")
		if err != nil {
			return "", fmt.Errorf("identity %s: %w", id, err)
		}
		res, err := sv.Verify(e, verify.NewPolicy(artifact, verify.WithCertificateIdentity(ci)))
		if err != nil {
			fails = append(fails, err.Error())
			continue
		}
		if err := signStatement(res); err != nil {
			return "", fmt.Errorf("keyless %s: %w", id, err)
		}
		return "keyless " + id.String(), nil
	}
	return "", errors.New(strings.Join(fails, "; "))
}

// verifyKeyed verifies a key-signed bundle with each of the rule's keys,
// each through sigstore-go with that key as the only trusted material (as
// cosign verify --key does; the bundle's key hint is not trusted).
func verifyKeyed(rule Rule, e verify.SignedEntity, artifact verify.ArtifactPolicyOption) (string, error) {
	var fails []string
	for _, k := range rule.Keys {
		var kf []string
		for _, kv := range k.Verifiers {
			tk := root.NewExpiringKey(kv, time.Time{}, time.Time{})
			tm := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) { return tk, nil })
			sv, err := verify.NewVerifier(tm, verify.WithNoObserverTimestamps())
			if err != nil {
				return "", fmt.Errorf("%s: %w", k.Name, err)
			}
			res, err := sv.Verify(e, verify.NewPolicy(artifact, verify.WithKey()))
			if err != nil {
				// The key's signature, over a statement about another
				// digest, is a different refusal from another key's.
				if _, err2 := sv.Verify(e, verify.NewPolicy(verify.WithoutArtifactUnsafe(), verify.WithKey())); err2 == nil {
					return "", fmt.Errorf("%s signed a statement about another digest: %w", k.Name, err)
				}
				kf = append(kf, err.Error())
				continue
			}
			if err := signStatement(res); err != nil {
				return "", fmt.Errorf("%s: %w", k.Name, err)
			}
			return k.Name, nil
		}
		fails = append(fails, k.Name+": "+strings.Join(kf, "; "))
	}
	return "", fmt.Errorf("signature by no trusted key (%s)", strings.Join(fails, "; "))
}

// signStatement refuses a verified DSSE statement that is not cosign
// sign's: an attestation of something else about the image.
func signStatement(res *verify.VerificationResult) error {
	if res == nil || res.Statement == nil {
		return nil // a message signature over the digest
	}
	if pt := res.Statement.GetPredicateType(); pt != SignPredicateType {
		return fmt.Errorf("signed an attestation of predicate type %q, not a signature (cosign sign's %q)", pt, SignPredicateType)
	}
	return nil
}

// get reads a manifest, bounded.
func (v *Verifier) get(ctx context.Context, ref name.Reference) ([]byte, error) {
	desc, err := remote.Get(ref, v.opts(ctx)...)
	if err != nil {
		return nil, err
	}
	if desc.Size > v.max() {
		return nil, fmt.Errorf("manifest of %d bytes, more than gpupin's limit of %d", desc.Size, v.max())
	}
	return desc.Manifest, nil
}

// blob reads a layer, bounded and checked against its digest.
func (v *Verifier) blob(ctx context.Context, repo name.Repository, d v1.Descriptor) ([]byte, error) {
	if d.Size > v.max() {
		return nil, fmt.Errorf("%d bytes, more than gpupin's limit of %d", d.Size, v.max())
	}
	l, err := remote.Layer(repo.Digest(d.Digest.String()), v.opts(ctx)...)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, v.max()+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > v.max() {
		return nil, fmt.Errorf("more than gpupin's limit of %d bytes", v.max())
	}
	if sum := sha256.Sum256(b); d.Digest.Algorithm != "sha256" || hex.EncodeToString(sum[:]) != d.Digest.Hex {
		return nil, fmt.Errorf("registry sent content that is not %s", d.Digest)
	}
	return b, nil
}

func (v *Verifier) max() int64 {
	if v.MaxBytes > 0 {
		return v.MaxBytes
	}
	return DefaultMaxBytes
}

// opts are the remote options with the deadline and the body bound.
func (v *Verifier) opts(ctx context.Context) []remote.Option {
	var rt http.RoundTripper = http.DefaultTransport
	if v.Transport != nil {
		rt = v.Transport
	}
	var kc authn.Keychain = authn.DefaultKeychain
	if v.Keychain != nil {
		kc = v.Keychain
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc),
		remote.WithTransport(limitTransport{rt: rt, max: v.max()})}
}

func isNotFound(err error) bool {
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode == http.StatusNotFound
	}
	return false
}

// limitTransport refuses a response body larger than max: go-containerregistry
// would read a manifest of any size into memory.
type limitTransport struct {
	rt  http.RoundTripper
	max int64
}

func (t limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > t.max {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: response of %d bytes, more than gpupin's limit of %d for signatures", req.URL.Path, resp.ContentLength, t.max)
	}
	resp.Body = &limitBody{rc: resp.Body, left: t.max, path: req.URL.Path}
	return resp, nil
}

type limitBody struct {
	rc   io.ReadCloser
	left int64
	path string
}

func (b *limitBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("%s: response of more than gpupin's limit for signatures", b.path)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n, fmt.Errorf("%s: response of more than gpupin's limit for signatures", b.path)
	}
	return n, err
}

func (b *limitBody) Close() error { return b.rc.Close() }

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
