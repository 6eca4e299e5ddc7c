package trust

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/options"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// What cosign's key files and classic signatures are made of.
const (
	// SimpleSigningMediaType is the media type of a classic signature's
	// payload layer in the sha256-<hex>.sig image.
	SimpleSigningMediaType types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SigstorePrivateKeyPEM is the PEM type `cosign generate-key-pair`
	// writes; CosignPrivateKeyPEM the one older cosign wrote. Both hold a
	// PKCS #8 key encrypted with go-securesystemslib's encrypted package
	// (scrypt and NaCl secretbox).
	SigstorePrivateKeyPEM = "ENCRYPTED SIGSTORE PRIVATE KEY"
	CosignPrivateKeyPEM   = "ENCRYPTED COSIGN PRIVATE KEY"
	// PasswordEnv is where cosign, and so gpupin, reads a key's password.
	PasswordEnv = "COSIGN_PASSWORD"
)

// SignKey is a cosign private key, loaded as cosign loads it.
type SignKey struct {
	// Name is what a policy listing the matching public key calls its
	// signer: "key FILE.pub (sha256:…)", FILE.pub being this key's path
	// with .key replaced, as cosign generate-key-pair names the pair.
	Name   string
	Public crypto.PublicKey
	sv     signature.SignerVerifier
}

// LoadSignKeyFile loads a cosign private key file, its password from
// COSIGN_PASSWORD (unset: the empty password, which cosign
// generate-key-pair accepts). gpupin never prompts: it signs in CI.
func LoadSignKeyFile(path string) (*SignKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	pass, set := os.LookupEnv(PasswordEnv)
	k, err := LoadSignKey(path, raw, []byte(pass))
	if err != nil && errors.Is(err, ErrWrongPassword) && !set {
		return nil, fmt.Errorf("%w (%s is not set; gpupin reads the password there, as cosign does)", err, PasswordEnv)
	}
	return k, err
}

// ErrWrongPassword is under LoadSignKey's error when the key does not
// decrypt with the password given.
var ErrWrongPassword = errors.New("wrong password")

// LoadSignKey loads a cosign private key (path names it in errors) as
// cosign's LoadPrivateKey does: the PEM block, decrypted with
// go-securesystemslib's encrypted package, a PKCS #8 key, and sigstore's
// default signer for it, the hash chosen by the key as cosign chooses it
// (ECDSA P-256 with SHA-256 for the keys cosign generates, P-384 with
// SHA-384, P-521 with SHA-512, RSA PKCS #1 v1.5 with SHA-256; Ed25519 as
// Ed25519ph, cosign's choice). A key sigstore has no signer for (RSA of
// another size than 2048, 3072 or 4096 bits) is refused, as is one whose
// signatures gpupin's own verifier could not check, so CI never publishes
// signatures the nodes' policy would reject.
func LoadSignKey(path string, pemBytes, password []byte) (*SignKey, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("signing key %s: %s", path, fmt.Sprintf(format, a...))
	}
	p, _ := pem.Decode(pemBytes)
	if p == nil {
		return nil, bad("not PEM (want cosign's %q, from cosign generate-key-pair)", SigstorePrivateKeyPEM)
	}
	if p.Type != SigstorePrivateKeyPEM && p.Type != CosignPrivateKeyPEM {
		return nil, bad("PEM type %q, not cosign's %q or %q (cosign import-key-pair converts a plain key)", p.Type, SigstorePrivateKeyPEM, CosignPrivateKeyPEM)
	}
	der, err := encrypted.Decrypt(p.Bytes, password)
	if err != nil {
		// The one error a readable file gives for a wrong password is the
		// secretbox's "decryption failed"; others are a damaged file.
		if strings.Contains(err.Error(), "decryption failed") {
			return nil, fmt.Errorf("signing key %s: %w: %v", path, ErrWrongPassword, err)
		}
		return nil, bad("decrypt: %v", err)
	}
	pk, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, bad("not a PKCS #8 private key: %v", err)
	}
	sv, err := signature.LoadDefaultSignerVerifier(pk, options.WithED25519ph())
	if err != nil {
		return nil, bad("%v", err)
	}
	pub, err := sv.PublicKey()
	if err != nil {
		return nil, bad("public key: %v", err)
	}
	if err := policyVerifies(sv, pub); err != nil {
		return nil, bad("%v", err)
	}
	fp, err := fingerprint(pub)
	if err != nil {
		return nil, bad("public key: %v", err)
	}
	pubName := strings.TrimSuffix(filepath.Base(path), ".key") + ".pub"
	return &SignKey{Name: "key " + pubName + " (" + fp + ")", Public: pub, sv: sv}, nil
}

// policyVerifies checks that a signature by sv passes the verifiers a
// policy builds for its public key (KeyVerifiers, loadRule's), so CI
// never publishes signatures the nodes' policy would reject.
func policyVerifies(sv signature.SignerVerifier, pub crypto.PublicKey) error {
	msg := []byte("gpupin: can the nodes' policy verify this key?")
	sig, err := sv.SignMessage(bytes.NewReader(msg))
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	vs, err := KeyVerifiers(pub)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if err = v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(msg)); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s whose signatures gpupin's signature policy cannot verify: %v", keyKind(pub), err)
}

// Signer writes cosign's classic signatures (cosign sign --key
// --tlog-upload=false): the simple-signing payload for a digest, signed,
// as a layer of the sha256-<hex>.sig image beside the signed manifest.
type Signer struct {
	Key *SignKey
	// Transport and Keychain reach the registry: publish's registry
	// policy, so signatures go where the images went. nil: Go's defaults.
	Transport http.RoundTripper
	Keychain  authn.Keychain
}

// Signed says where one signature went.
type Signed struct {
	// Ref is the signed repo@digest.
	Ref string `json:"ref"`
	// Tag is the signature image's tag, repo:sha256-<hex>.sig.
	Tag string `json:"tag"`
	// Digest is the signature image's manifest digest after the write.
	Digest string `json:"digest"`
	// Already: this key's signature over the digest was there, nothing
	// was written (a rerun of the same publish).
	Already bool `json:"already,omitempty"`
	// Signatures is how many the tag holds now, others' included.
	Signatures int `json:"signatures"`
}

// Sign signs ref's digest and pushes the signature. An existing
// signature image is appended to, as cosign does, so other signers'
// signatures stay; one holding this key's valid signature over the same
// payload is left as it is. Errors name the image.
func (s *Signer) Sign(ctx context.Context, ref name.Digest) (Signed, error) {
	out, err := s.sign(ctx, ref)
	if err != nil {
		return out, fmt.Errorf("sign %s: %w", ref, err)
	}
	return out, nil
}

func (s *Signer) sign(ctx context.Context, ref name.Digest) (Signed, error) {
	if s.Key == nil {
		return Signed{}, errors.New("no signing key")
	}
	h, err := v1.NewHash(ref.DigestStr())
	if err != nil {
		return Signed{}, fmt.Errorf("digest: %w", err)
	}
	tag := ref.Context().Tag(fmt.Sprintf("%s-%s.sig", h.Algorithm, h.Hex))
	out := Signed{Ref: ref.String(), Tag: tag.String()}
	// cosign's payload: the digest, and the repository as the claimed
	// identity (docker-reference), what cosign verify checks.
	body, err := payload.Cosign{Image: ref}.MarshalJSON()
	if err != nil {
		return out, fmt.Errorf("payload: %w", err)
	}
	opts := s.opts(ctx)
	base, err := s.existing(tag, opts)
	if err != nil {
		return out, err
	}
	m, err := base.Manifest()
	if err != nil {
		return out, fmt.Errorf("signature image %s: manifest: %w", tag.TagStr(), err)
	}
	if s.holds(ctx, m, body) {
		d, err := base.Digest()
		if err != nil {
			return out, fmt.Errorf("signature image %s: %w", tag.TagStr(), err)
		}
		out.Already, out.Digest, out.Signatures = true, d.String(), countSigned(m)
		return out, nil
	}
	// Nodes read at most maxSignatures layers (verify.go): one more would
	// make the whole tag unreadable to them, every signature in it lost.
	if len(m.Layers) >= maxSignatures {
		return out, fmt.Errorf("signature image %s holds %d signatures already, and gpupin nodes read at most %d: remove old ones (cosign clean --type signature) first", tag.TagStr(), len(m.Layers), maxSignatures)
	}
	sig, err := s.Key.sv.SignMessage(bytes.NewReader(body), options.WithContext(ctx))
	if err != nil {
		return out, fmt.Errorf("sign payload with %s: %w", s.Key.Name, err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(body, SimpleSigningMediaType),
		Annotations: map[string]string{AnnotationSignature: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		return out, fmt.Errorf("signature image: %w", err)
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		return out, fmt.Errorf("push signature image %s: %w", tag.TagStr(), err)
	}
	d, err := img.Digest()
	if err != nil {
		return out, fmt.Errorf("signature image: %w", err)
	}
	nm, err := img.Manifest()
	if err != nil {
		return out, fmt.Errorf("signature image: %w", err)
	}
	out.Digest, out.Signatures = d.String(), countSigned(nm)
	return out, nil
}

// existing is the signature image at tag, or cosign's empty one (OCI
// manifest and config media types) when there is none yet.
func (s *Signer) existing(tag name.Tag, opts []remote.Option) (v1.Image, error) {
	img, err := remote.Image(tag, opts...)
	if err == nil {
		return img, nil
	}
	if !isNotFound(err) {
		return nil, fmt.Errorf("read signature image %s: %w", tag.TagStr(), err)
	}
	return mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), nil
}

// holds says whether m already has a layer carrying this payload with a
// signature this key made: cosign's dupe detector, so a rerun adds
// nothing. ECDSA signatures differ each time, so the check is by
// verification, not by comparing bytes.
func (s *Signer) holds(ctx context.Context, m *v1.Manifest, body []byte) bool {
	want := v1.Hash{Algorithm: "sha256", Hex: sha256Hex(body)}
	for _, l := range m.Layers {
		sig64, ok := l.Annotations[AnnotationSignature]
		if !ok || l.Digest != want {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(sig64)
		if err != nil {
			continue
		}
		if err := s.Key.sv.VerifySignature(bytes.NewReader(sig), bytes.NewReader(body), options.WithContext(ctx)); err == nil {
			// The payload's bytes are known (its digest matched); that the
			// blob is really there is the registry's to keep.
			return true
		}
	}
	return false
}

func countSigned(m *v1.Manifest) int {
	n := 0
	for _, l := range m.Layers {
		if _, ok := l.Annotations[AnnotationSignature]; ok {
			n++
		}
	}
	return n
}

func (s *Signer) opts(ctx context.Context) []remote.Option {
	var rt http.RoundTripper = http.DefaultTransport
	if s.Transport != nil {
		rt = s.Transport
	}
	var kc authn.Keychain = authn.DefaultKeychain
	if s.Keychain != nil {
		kc = s.Keychain
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithTransport(rt), remote.WithUserAgent("gpupin-sign")}
}
