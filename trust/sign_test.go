package trust_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/gpupin/gpupin/trust"
	"github.com/gpupin/gpupin/trust/trusttest"
)

const testPassword = "correct horse battery staple"

// sigManifest reads the sha256-<hex>.sig manifest of d.
func sigManifest(t testing.TB, d name.Digest) *v1.Manifest {
	t.Helper()
	h, _ := v1.NewHash(d.DigestStr())
	img, err := remote.Image(d.Context().Tag(fmt.Sprintf("%s-%s.sig", h.Algorithm, h.Hex)))
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSignVerifies: what trust.Signer writes to a real registry passes
// gpupin's own verifier for the matching public key, is laid out as
// cosign lays out a classic signature, keeps other signers' signatures,
// and a rerun adds nothing.
func TestSignVerifies(t *testing.T) {
	dir := t.TempDir()
	ci := trusttest.LoadSignKey(t, trusttest.WriteCosignKey(t, dir, "ci", trusttest.P256(t), testPassword, trust.SigstorePrivateKeyPEM), testPassword)
	other := newKey(t, dir, "other.pub")
	onlyCI := trusttest.Policy(t, dir, "default: {mode: required, keys: [ci.pub]}\n")
	cases := []struct {
		name string
		// run signs in g and returns the image to verify, the index digest
		// to pass, and what the last Sign said.
		run func(t *testing.T, g *trusttest.Registry, s *trust.Signer) (img name.Digest, index string, last trust.Signed)
		// signatures is how many the image's (or the index's) tag holds.
		signatures int
	}{
		{"variant manifest", func(t *testing.T, g *trusttest.Registry, s *trust.Signer) (name.Digest, string, trust.Signed) {
			img := g.Push(t, "org/vllm")
			out, err := s.Sign(context.Background(), img)
			if err != nil {
				t.Fatal(err)
			}
			if out.Already {
				t.Fatal("first signature reported as already there")
			}
			return img, "", out
		}, 1},
		{"rerun adds nothing", func(t *testing.T, g *trusttest.Registry, s *trust.Signer) (name.Digest, string, trust.Signed) {
			img := g.Push(t, "org/vllm")
			first, err := s.Sign(context.Background(), img)
			if err != nil {
				t.Fatal(err)
			}
			again, err := s.Sign(context.Background(), img)
			if err != nil {
				t.Fatal(err)
			}
			if !again.Already || again.Digest != first.Digest {
				t.Fatalf("rerun: %+v after %+v; want the same signature image, untouched", again, first)
			}
			return img, "", again
		}, 1},
		{"beside another signer's", func(t *testing.T, g *trusttest.Registry, s *trust.Signer) (name.Digest, string, trust.Signed) {
			img := g.Push(t, "org/vllm")
			trusttest.SignClassic(t, other, img, img, nil)
			out, err := s.Sign(context.Background(), img)
			if err != nil {
				t.Fatal(err)
			}
			// The other signer's signature is still there and still good.
			pol := trusttest.Policy(t, dir, "default: {mode: required, keys: [other.pub]}\n")
			if _, err := (&trust.Verifier{Policy: pol}).Verify(context.Background(), "vllm", "cu13", img.String(), ""); err != nil {
				t.Fatalf("the other signer's signature: %v", err)
			}
			return img, "", out
		}, 2},
		{"index", func(t *testing.T, g *trusttest.Registry, s *trust.Signer) (name.Digest, string, trust.Signed) {
			img, idx := g.Push(t, "org/vllm"), g.Push(t, "org/vllm") // idx stands in for the index
			out, err := s.Sign(context.Background(), idx)
			if err != nil {
				t.Fatal(err)
			}
			return img, idx.DigestStr(), out
		}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := trusttest.NewRegistry(t, true)
			img, index, out := tc.run(t, g, &trust.Signer{Key: ci})
			signedRef := img
			if index != "" {
				signedRef = img.Context().Digest(index)
			}
			if out.Ref != signedRef.String() || out.Signatures != tc.signatures || !strings.HasSuffix(out.Tag, ".sig") {
				t.Fatalf("Sign = %+v; want ref %s, %d signature(s)", out, signedRef, tc.signatures)
			}
			s, err := (&trust.Verifier{Policy: onlyCI}).Verify(context.Background(), "vllm", "cu13", img.String(), index)
			if err != nil {
				t.Fatalf("gpupin's verifier: %v", err)
			}
			if s.By != ci.Name || s.Digest != signedRef.DigestStr() {
				t.Fatalf("verified %+v; want by %q over %s", s, ci.Name, signedRef.DigestStr())
			}
			checkCosignLayout(t, signedRef, tc.signatures)
		})
	}
}

// checkCosignLayout reads the signature image as cosign lays it out: an
// OCI manifest and config, one simple-signing layer per signature with
// its base64 in the annotation, this one's payload naming the repository
// and the digest.
func checkCosignLayout(t *testing.T, d name.Digest, n int) {
	t.Helper()
	m := sigManifest(t, d)
	if m.MediaType != types.OCIManifestSchema1 || len(m.Layers) != n {
		t.Fatalf("signature manifest %s, %d layers; want cosign's OCI layout with %d", m.MediaType, len(m.Layers), n)
	}
	// An image the Signer began has cosign's empty config; one it
	// appended to keeps the config its first signer wrote.
	if n == 1 && m.Config.MediaType != types.OCIConfigJSON {
		t.Fatalf("signature config %s; cosign writes %s", m.Config.MediaType, types.OCIConfigJSON)
	}
	var found bool
	for _, l := range m.Layers {
		if l.MediaType != trust.SimpleSigningMediaType || l.Annotations[trust.AnnotationSignature] == "" {
			t.Fatalf("layer %+v is not a simple-signing signature", l)
		}
		raw, err := remote.Layer(d.Context().Digest(l.Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := raw.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		var p payload.SimpleContainerImage
		err = json.NewDecoder(rc).Decode(&p)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if p.Critical.Type == payload.CosignSignatureType && p.Critical.Image.DockerManifestDigest == d.DigestStr() && p.Critical.Identity.DockerReference == d.Context().Name() {
			found = true
		}
	}
	if !found {
		t.Fatalf("no layer's payload names %s in %s", d.DigestStr(), d.Context().Name())
	}
}

// TestLoadSignKey: cosign's key formats load, of each key type cosign
// signs with; a key that is not one, a wrong password, a damaged file and
// a key sigstore has no signer for are each refused, naming the file and
// why.
func TestLoadSignKey(t *testing.T) {
	dir := t.TempDir()
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rk1024, err := rsa.GenerateKey(rand.Reader, 1024) // sigstore has no signer for it
	if err != nil {
		t.Fatal(err)
	}
	good := trusttest.WriteCosignKey(t, dir, "good", trusttest.P256(t), testPassword, trust.SigstorePrivateKeyPEM)
	damaged := filepath.Join(dir, "damaged.key")
	{
		raw, _ := os.ReadFile(good)
		b, _ := pem.Decode(raw)
		b.Bytes = []byte(strings.Replace(string(b.Bytes), `"ciphertext":"`, `"ciphertext":"AAAA`, 1))
		if err := os.WriteFile(damaged, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	plain := filepath.Join(dir, "plain.key")
	{
		der, _ := x509.MarshalECPrivateKey(trusttest.P256(t))
		if err := os.WriteFile(plain, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	notPEM := filepath.Join(dir, "junk.key")
	if err := os.WriteFile(notPEM, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, password string
		want                 string // "" loads
	}{
		{"sigstore PEM type", good, testPassword, ""},
		{"cosign PEM type", trusttest.WriteCosignKey(t, dir, "old", trusttest.P256(t), testPassword, trust.CosignPrivateKeyPEM), testPassword, ""},
		{"empty password", trusttest.WriteCosignKey(t, dir, "nopass", trusttest.P256(t), "", trust.SigstorePrivateKeyPEM), "", ""},
		{"RSA", trusttest.WriteCosignKey(t, dir, "rsa", rk, testPassword, trust.SigstorePrivateKeyPEM), testPassword, ""},
		{"wrong password", good, "hunter2", "wrong password"},
		{"damaged", damaged, testPassword, "decrypt"},
		{"plain PEM key", plain, testPassword, `PEM type "EC PRIVATE KEY"`},
		{"not PEM", notPEM, testPassword, "not PEM"},
		{"P-384", trusttest.WriteCosignKey(t, dir, "p384", p384, testPassword, trust.SigstorePrivateKeyPEM), testPassword, ""},
		{"Ed25519", trusttest.WriteCosignKey(t, dir, "ed", ed, testPassword, trust.SigstorePrivateKeyPEM), testPassword, ""},
		{"RSA of 1024 bits", trusttest.WriteCosignKey(t, dir, "rsa1024", rk1024, testPassword, trust.SigstorePrivateKeyPEM), testPassword, "unsupported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := os.ReadFile(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			k, err := trust.LoadSignKey(tc.path, raw, []byte(tc.password))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("LoadSignKey: %v", err)
				}
				base := strings.TrimSuffix(filepath.Base(tc.path), ".key")
				if !strings.HasPrefix(k.Name, "key "+base+".pub (sha256:") {
					t.Fatalf("name %q", k.Name)
				}
				// The name is the one a policy listing the .pub gives.
				pol := trusttest.Policy(t, dir, fmt.Sprintf("default: {mode: required, keys: [%s.pub]}\n", base))
				if got := pol.For("x").Keys[0].Name; got != k.Name {
					t.Fatalf("key named %q, the policy names its public key %q", k.Name, got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("LoadSignKey: %v; want an error naming %s with %q", err, tc.path, tc.want)
			}
		})
	}
}

// TestLoadSignKeyFilePassword: the password comes from COSIGN_PASSWORD,
// as cosign reads it; unset, the error says where it is read.
func TestLoadSignKeyFilePassword(t *testing.T) {
	dir := t.TempDir()
	path := trusttest.WriteCosignKey(t, dir, "ci", trusttest.P256(t), testPassword, trust.SigstorePrivateKeyPEM)
	cases := []struct {
		name string
		env  *string
		path string
		want string
	}{
		{"from COSIGN_PASSWORD", ptr(testPassword), path, ""},
		{"wrong COSIGN_PASSWORD", ptr("nope"), path, "wrong password"},
		{"unset", nil, path, "COSIGN_PASSWORD is not set"},
		{"missing file", ptr(testPassword), filepath.Join(dir, "gone.key"), "signing key: open"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(trust.PasswordEnv, "") // restored after the test
			if tc.env == nil {
				os.Unsetenv(trust.PasswordEnv)
			} else {
				os.Setenv(trust.PasswordEnv, *tc.env)
			}
			_, err := trust.LoadSignKeyFile(tc.path)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadSignKeyFile: %v; want %q", err, tc.want)
			}
			if tc.want == "wrong password" && !errors.Is(err, trust.ErrWrongPassword) {
				t.Fatalf("%v is not ErrWrongPassword", err)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestSignRefused: a registry that refuses the signature push, or fails
// to say whether one exists, and a tag already holding as many signatures
// as nodes read: each an error naming the image, nothing half-written.
func TestSignRefused(t *testing.T) {
	dir := t.TempDir()
	ci := trusttest.LoadSignKey(t, trusttest.WriteCosignKey(t, dir, "ci", trusttest.P256(t), testPassword, trust.SigstorePrivateKeyPEM), testPassword)
	isSigTag := func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, ".sig") }
	cases := []struct {
		name  string
		setup func(t *testing.T, g *trusttest.Registry, img name.Digest)
		want  string
	}{
		{"push refused", func(t *testing.T, g *trusttest.Registry, _ name.Digest) {
			g.Wrap = func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodPut && isSigTag(r) {
					http.Error(w, `{"errors":[{"code":"DENIED","message":"no pushes of signatures here"}]}`, http.StatusForbidden)
					return true
				}
				return false
			}
		}, "push signature image sha256-"},
		{"read fails", func(t *testing.T, g *trusttest.Registry, _ name.Digest) {
			g.Wrap = func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodPut && isSigTag(r) {
					http.Error(w, `{"errors":[{"code":"DENIED","message":"no reads of signatures here"}]}`, http.StatusForbidden)
					return true
				}
				return false
			}
		}, "read signature image sha256-"},
		{"full signature tag", func(t *testing.T, g *trusttest.Registry, img name.Digest) {
			base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
			for i := 0; i < 32; i++ {
				var err error
				base, err = mutate.Append(base, mutate.Addendum{Layer: static.NewLayer([]byte(fmt.Sprintf(`{"n":%d}`, i)), trust.SimpleSigningMediaType), Annotations: map[string]string{trust.AnnotationSignature: "AAAA"}})
				if err != nil {
					t.Fatal(err)
				}
			}
			h, _ := v1.NewHash(img.DigestStr())
			if err := remote.Write(img.Context().Tag(fmt.Sprintf("%s-%s.sig", h.Algorithm, h.Hex)), base); err != nil {
				t.Fatal(err)
			}
		}, "holds 32 signatures already"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := trusttest.NewRegistry(t, true)
			img := g.Push(t, "org/vllm")
			tc.setup(t, g, img)
			_, err := (&trust.Signer{Key: ci}).Sign(context.Background(), img)
			if err == nil || !strings.HasPrefix(err.Error(), "sign "+img.String()+": ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Sign: %v; want an error naming %s with %q", err, img, tc.want)
			}
		})
	}
}

// TestSignKeyTypes: keys of each type cosign signs with (P-256, its
// default; P-384 with SHA-384, P-521 with SHA-512, Ed25519 as Ed25519ph,
// RSA) sign through trust.Signer and verify with the nodes' policy naming
// their public key, to a real registry; another key's policy refuses each.
func TestSignKeyTypes(t *testing.T) {
	dir := t.TempDir()
	newKey(t, dir, "other.pub")
	ecKey := func(c elliptic.Curve) crypto.Signer {
		k, err := ecdsa.GenerateKey(c, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	keys := []struct {
		name string
		priv crypto.Signer
	}{{"p256", ecKey(elliptic.P256())}, {"p384", ecKey(elliptic.P384())}, {"p521", ecKey(elliptic.P521())}, {"ed25519", ed}, {"rsa3072", rk}}
	otherOnly := trusttest.Policy(t, dir, "default: {mode: required, keys: [other.pub]}\n")
	for _, k := range keys {
		t.Run(k.name, func(t *testing.T) {
			key := trusttest.LoadSignKey(t, trusttest.WriteCosignKey(t, dir, k.name, k.priv, testPassword, trust.SigstorePrivateKeyPEM), testPassword)
			g := trusttest.NewRegistry(t, true)
			img := g.Push(t, "org/vllm")
			if _, err := (&trust.Signer{Key: key}).Sign(context.Background(), img); err != nil {
				t.Fatal(err)
			}
			checkCosignLayout(t, img, 1)
			pol := trusttest.Policy(t, dir, fmt.Sprintf("default: {mode: required, keys: [%s.pub]}\n", k.name))
			s, err := (&trust.Verifier{Policy: pol}).Verify(context.Background(), "vllm", "cu13", img.String(), "")
			if err != nil || s.By != key.Name {
				t.Fatalf("Verify = %+v, %v; want signed by %s", s, err, key.Name)
			}
			_, err = (&trust.Verifier{Policy: otherOnly}).Verify(context.Background(), "vllm", "cu13", img.String(), "")
			if err == nil || !strings.Contains(err.Error(), "engine vllm variant cu13") || !strings.Contains(err.Error(), "signature by no trusted key") {
				t.Fatalf("another key's policy: %v", err)
			}
		})
	}
}
