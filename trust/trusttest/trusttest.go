// Package trusttest is test support for signature policy tests: cosign
// key files, public keys, policies, a loopback registry and cosign's
// classic signature written by hand. It is not internal because
// tools/cosign, another module, imports it too.
package trusttest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/gpupin/gpupin/trust"
)

// P256 is a fresh ECDSA P-256 key, cosign generate-key-pair's kind.
func P256(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// WriteCosignKey writes priv as cosign generate-key-pair writes a pair:
// dir/BASE.key, PKCS #8 encrypted under password with go-securesystemslib's
// encrypted package in a PEM block of pemType ("" is cosign's current
// trust.SigstorePrivateKeyPEM), and dir/BASE.pub. It returns the .key's path.
func WriteCosignKey(t testing.TB, dir, base string, priv crypto.Signer, password, pemType string) string {
	t.Helper()
	if pemType == "" {
		pemType = trust.SigstorePrivateKeyPEM
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := encrypted.Encrypt(der, []byte(password))
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(dir, base+".key")
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: enc}), 0o600); err != nil {
		t.Fatal(err)
	}
	WritePub(t, dir, base+".pub", priv.Public())
	return keyPath
}

// WritePub writes pub as a PEM file dir/file, as cosign.pub is, and
// returns its path.
func WritePub(t testing.TB, dir, file string, pub crypto.PublicKey) string {
	t.Helper()
	b, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// LoadSignKey loads a cosign key file with trust.LoadSignKey.
func LoadSignKey(t testing.TB, path, password string) *trust.SignKey {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := trust.LoadSignKey(path, raw, []byte(password))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Policy writes text as dir/policy.yaml and loads it.
func Policy(t testing.TB, dir, text string) *trust.Policy {
	t.Helper()
	p := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := trust.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// Registry is go-containerregistry's registry on loopback (plain HTTP,
// which both cosign and gpupin speak there), behind a wrapper a test can
// set to misbehave for some requests.
type Registry struct {
	Host string
	// Wrap, when set, sees each request first; true: it answered.
	Wrap func(w http.ResponseWriter, r *http.Request) bool
}

// NewRegistry starts a registry, with the OCI referrers API when
// referrers is set (without it, clients fall back to the referrers tag).
func NewRegistry(t testing.TB, referrers bool) *Registry {
	t.Helper()
	g := &Registry{}
	opts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if referrers {
		opts = append(opts, registry.WithReferrersSupport(true))
	}
	inner := registry.New(opts...)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.Wrap != nil && g.Wrap(w, r) {
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.Host = strings.TrimPrefix(srv.URL, "http://")
	return g
}

// Push is PushImage into g.
func (g *Registry) Push(t testing.TB, repo string) name.Digest { return PushImage(t, g.Host, repo) }

// PushImage writes a random image as host/repo:v1 and returns its
// repo@digest.
func PushImage(t testing.TB, host, repo string) name.Digest {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag := tagOf(t, host+"/"+repo+":v1")
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return tag.Context().Digest(d.String())
}

// PushIndex writes an index of two random images as host/repo:v1 and
// returns the index's and its first child's repo@digest.
func PushIndex(t testing.TB, host, repo string) (index, child name.Digest) {
	t.Helper()
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	tag := tagOf(t, host+"/"+repo+":v1")
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return tag.Context().Digest(d.String()), tag.Context().Digest(im.Manifests[0].Digest.String())
}

func tagOf(t testing.TB, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// SignClassic writes cosign's classic signature by priv (ECDSA with
// SHA-256) of `over` into the sha256-<hex>.sig tag of `at`, as cosign sign
// --key does, written here without trust.Signer so that the verifier is
// tested against what it did not write; mangle, when set, changes the
// base64 signature.
func SignClassic(t testing.TB, priv crypto.Signer, at, over name.Digest, mangle func(string) string) {
	t.Helper()
	body, err := json.Marshal(payload.Cosign{Image: over})
	if err != nil {
		t.Fatal(err)
	}
	s, err := signature.LoadSigner(priv, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := s.SignMessage(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString(sig)
	if mangle != nil {
		b64 = mangle(b64)
	}
	l := static.NewLayer(body, trust.SimpleSigningMediaType)
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{Layer: l, Annotations: map[string]string{trust.AnnotationSignature: b64}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := v1.NewHash(at.DigestStr())
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(at.Context().Tag(fmt.Sprintf("%s-%s.sig", h.Algorithm, h.Hex)), img); err != nil {
		t.Fatal(err)
	}
}
