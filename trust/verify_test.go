package trust_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/testing/ca"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/options"

	"github.com/gpupin/gpupin/trust"
	"github.com/gpupin/gpupin/trust/trusttest"
)

// newKey is a P-256 key whose public half is dir/file.
func newKey(t testing.TB, dir, file string) *ecdsa.PrivateKey {
	t.Helper()
	k := trusttest.P256(t)
	trusttest.WritePub(t, dir, file, k.Public())
	return k
}

// pushBundleReferrer writes body as a Sigstore bundle referrer of at.
func pushBundleReferrer(t testing.TB, at name.Digest, body []byte) {
	t.Helper()
	desc, err := remote.Head(at)
	if err != nil {
		t.Fatal(err)
	}
	l := static.NewLayer(body, "application/vnd.dev.sigstore.bundle.v0.3+json")
	if err := remote.WriteLayer(at.Context(), l); err != nil {
		t.Fatal(err)
	}
	// The config's media type is the artifact type too: go-containerregistry's
	// registry lists a referrer's artifactType from it.
	cfg := static.NewLayer([]byte("{}"), "application/vnd.dev.sigstore.bundle.v0.3+json")
	if err := remote.WriteLayer(at.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	ld, _ := l.Digest()
	cd, _ := cfg.Digest()
	m := map[string]any{
		"schemaVersion": 2, "mediaType": types.OCIManifestSchema1, "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json",
		"config":  map[string]any{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "digest": cd.String(), "size": 2},
		"layers":  []any{map[string]any{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "digest": ld.String(), "size": len(body)}},
		"subject": map[string]any{"mediaType": desc.MediaType, "digest": desc.Digest.String(), "size": desc.Size},
	}
	raw, _ := json.Marshal(m)
	sum := sha256.Sum256(raw)
	if err := remote.Put(at.Context().Digest(fmt.Sprintf("sha256:%x", sum)), rawManifest{raw, types.OCIManifestSchema1}); err != nil {
		t.Fatal(err)
	}
}

type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.b, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// TestVerifyClassic: cosign's sha256-<hex>.sig scheme against a real
// registry, each bad signature refused with engine, variant and why.
func TestVerifyClassic(t *testing.T) {
	dir := t.TempDir()
	ci := newKey(t, dir, "ci.pub")
	other := newKey(t, dir, "other.pub")
	pol := trusttest.Policy(t, dir, "engines:\n  vllm:\n    mode: required\n    keys: [ci.pub]\n")
	cases := []struct {
		name string
		sign func(g *trusttest.Registry, img, img2 name.Digest)
		want string // "" = verifies
	}{
		{"signed", func(g *trusttest.Registry, img, _ name.Digest) { trusttest.SignClassic(t, ci, img, img, nil) }, ""},
		{"unsigned", func(*trusttest.Registry, name.Digest, name.Digest) {}, "no signature"},
		{"another key", func(g *trusttest.Registry, img, _ name.Digest) { trusttest.SignClassic(t, other, img, img, nil) }, "signature by no trusted key"},
		{"another digest", func(g *trusttest.Registry, img, img2 name.Digest) { trusttest.SignClassic(t, ci, img, img2, nil) }, "signed digest " + "sha256:"},
		{"corrupted signature", func(g *trusttest.Registry, img, _ name.Digest) {
			trusttest.SignClassic(t, ci, img, img, func(s string) string { return "AAAA" + s[4:] })
		}, "signature by no trusted key"},
		{"truncated signature", func(g *trusttest.Registry, img, _ name.Digest) {
			trusttest.SignClassic(t, ci, img, img, func(s string) string { return s[:len(s)/2] })
		}, "signature"},
		{"huge signature manifest", func(g *trusttest.Registry, img, _ name.Digest) {
			g.Wrap = func(w http.ResponseWriter, r *http.Request) bool {
				if !strings.Contains(r.URL.Path, ".sig") {
					return false
				}
				w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
				w.Header().Set("Docker-Content-Digest", "sha256:"+strings.Repeat("0", 64))
				if r.Method == http.MethodHead {
					w.Header().Set("Content-Length", "1073741824")
					return true
				}
				// Chunked, no length: the bound is on the bytes read.
				chunk := []byte(strings.Repeat(" ", 1<<16))
				for i := 0; i < 1<<14; i++ {
					if _, err := w.Write(chunk); err != nil {
						return true
					}
				}
				return true
			}
		}, "limit"},
		{"stalled signature tag", func(g *trusttest.Registry, img, _ name.Digest) {
			g.Wrap = func(w http.ResponseWriter, r *http.Request) bool {
				if !strings.Contains(r.URL.Path, ".sig") {
					return false
				}
				<-r.Context().Done()
				return true
			}
		}, "signature fetch took more than 500ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := trusttest.NewRegistry(t, true)
			img := g.Push(t, "org/vllm")
			img2 := g.Push(t, "org/vllm")
			tc.sign(g, img, img2)
			v := &trust.Verifier{Policy: pol, MaxBytes: 1 << 20, Timeout: 500 * time.Millisecond}
			start := time.Now()
			s, err := v.Verify(context.Background(), "vllm", "cu13", img.String(), "")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if s == nil || s.Digest != img.DigestStr() || !strings.HasPrefix(s.By, "key ci.pub (sha256:") || s.Mode != trust.ModeRequired {
					t.Fatalf("signature %+v", s)
				}
				return
			}
			if err == nil {
				t.Fatalf("Verify passed, want refusal with %q", tc.want)
			}
			var te *trust.Error
			if !errors.As(err, &te) || te.Engine != "vllm" || te.Variant != "cu13" {
				t.Fatalf("error %v is not a trust.Error naming engine and variant", err)
			}
			msg := err.Error()
			for _, w := range []string{"engine vllm", "variant cu13", tc.want} {
				if !strings.Contains(msg, w) {
					t.Fatalf("error %q lacks %q", msg, w)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("refusal took %s", d)
			}
		})
	}
}

// TestVerifyIndexSignature: a signature over the index the variant was
// chosen from counts; one over an unrelated digest does not.
func TestVerifyIndexSignature(t *testing.T) {
	dir := t.TempDir()
	ci := newKey(t, dir, "ci.pub")
	pol := trusttest.Policy(t, dir, "default: {mode: required, keys: [ci.pub]}\n")
	g := trusttest.NewRegistry(t, true)
	img, idx := g.Push(t, "org/e"), g.Push(t, "org/e") // idx stands in for the index's digest
	trusttest.SignClassic(t, ci, idx, idx, nil)
	v := &trust.Verifier{Policy: pol}
	s, err := v.Verify(context.Background(), "sglang", "cu129", img.String(), idx.DigestStr())
	if err != nil || s.Digest != idx.DigestStr() {
		t.Fatalf("Verify = %+v, %v; want the index's signature", s, err)
	}
	if _, err := v.Verify(context.Background(), "sglang", "cu129", img.String(), ""); !errors.Is(err, trust.ErrUnsigned) {
		t.Fatalf("without the index: %v, want ErrUnsigned", err)
	}
}

// TestVerifyOff: mode off fetches nothing and asks for nothing.
func TestVerifyOff(t *testing.T) {
	g := trusttest.NewRegistry(t, true)
	g.Wrap = func(w http.ResponseWriter, r *http.Request) bool {
		t.Errorf("fetched %s under mode off", r.URL)
		return false
	}
	v := &trust.Verifier{Policy: trust.Off()}
	s, err := v.Verify(context.Background(), "vllm", "cu13", g.Host+"/org/vllm@sha256:"+strings.Repeat("a", 64), "")
	if s != nil || err != nil {
		t.Fatalf("Verify = %v, %v", s, err)
	}
}

// virtualRoot writes a VirtualSigstore's trusted root as the JSON file a
// node keeps offline.
func virtualRoot(t testing.TB, dir string) (*ca.VirtualSigstore, string) {
	t.Helper()
	vs, err := ca.NewVirtualSigstore()
	if err != nil {
		t.Fatal(err)
	}
	// VirtualSigstore keeps a log's ID as its hex text, where a trusted
	// root holds the raw bytes: give the file the raw ones.
	raw := func(logs map[string]*root.TransparencyLog) map[string]*root.TransparencyLog {
		out := map[string]*root.TransparencyLog{}
		for k, l := range logs {
			c := *l
			id, err := hex.DecodeString(string(l.ID))
			if err != nil {
				t.Fatal(err)
			}
			c.ID = id
			out[k] = &c
		}
		return out
	}
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01, vs.FulcioCertificateAuthorities(), raw(vs.CTLogs()), vs.TimestampingAuthorities(), raw(vs.RekorLogs()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := tr.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "trusted_root.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return vs, p
}

// TestVerifyKeyless: sigstore-go's verification with the policy's
// identities and the offline trusted root the policy file names.
func TestVerifyKeyless(t *testing.T) {
	dir := t.TempDir()
	vs, _ := virtualRoot(t, dir)
	const issuer, subject = "https://token.actions.example", "https://github.com/org/repo/.github/workflows/release.yml@refs/heads/main"
	pol := trusttest.Policy(t, dir, fmt.Sprintf("engines:\n  vllm:\n    mode: required\n    trustedRoot: trusted_root.json\n    identities:\n      - {issuer: %q, subject: %q}\n", issuer, subject))
	rule := pol.For("vllm")
	artifact := []byte("a manifest")
	sum := sha256.Sum256(artifact)
	h := v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
	cases := []struct {
		name, subject, issuer string
		over                  v1.Hash
		ok                    bool
	}{
		{"trusted identity", subject, issuer, h, true},
		{"another subject", "https://github.com/evil/repo/x.yml@refs/heads/main", issuer, h, false},
		{"another issuer", subject, "https://accounts.example", h, false},
		{"another digest", subject, issuer, v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("b", 64)}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := vs.Sign(tc.subject, tc.issuer, artifact)
			if err != nil {
				t.Fatal(err)
			}
			by, err := trust.VerifyEntity(rule, e, tc.over)
			if tc.ok != (err == nil) {
				t.Fatalf("VerifyEntity = %q, %v; want ok %v", by, err, tc.ok)
			}
			if tc.ok && by != "keyless "+subject+" ("+issuer+")" {
				t.Fatalf("by %q", by)
			}
		})
	}
	// A referrer whose bundle is truncated or not a bundle: refused, named.
	for _, body := range [][]byte{[]byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":`), []byte(`not json`)} {
		g := trusttest.NewRegistry(t, true)
		img := g.Push(t, "org/vllm")
		pushBundleReferrer(t, img, body)
		_, err := (&trust.Verifier{Policy: pol}).Verify(context.Background(), "vllm", "cu13", img.String(), "")
		if err == nil || !strings.Contains(err.Error(), "not a Sigstore bundle") || !strings.Contains(err.Error(), "engine vllm variant cu13") {
			t.Fatalf("truncated bundle: %v", err)
		}
	}
}

// TestParseErrors: a policy that does not parse says where and why.
func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	newKey(t, dir, "ci.pub")
	if err := os.WriteFile(filepath.Join(dir, "bad.pub"), []byte("not a key"), 0o644); err != nil {
		t.Fatal(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	trusttest.WritePub(t, dir, "rsa1024.pub", rk.Public())
	cases := []struct{ name, text, want string }{
		{"yaml syntax", "engines:\n  vllm: [\n", "policy P: line"},
		{"unknown field", "engines:\n  vllm:\n    mod: required\n", "line 3: field mod not found"},
		{"bad mode", "engines:\n  vllm:\n    mode: requird\n", `engines.vllm.mode: "requird" is neither "required" nor "off"`},
		{"required with nothing", "default: {mode: required}\n", "default.mode: required names no keys and no identities"},
		{"missing key file", "engines:\n  vllm: {mode: required, keys: [gone.pub]}\n", "engines.vllm.keys[0]: open"},
		{"not a key", "engines:\n  vllm: {mode: required, keys: [bad.pub]}\n", "engines.vllm.keys[0]: bad.pub: not a PEM public key"},
		{"RSA of 1024 bits", "engines:\n  vllm: {mode: required, keys: [rsa1024.pub]}\n", "engines.vllm.keys[0]: rsa1024.pub: an RSA key of 1024 bits, which sigstore does not verify"},
		{"identity without root", "engines:\n  vllm: {mode: required, identities: [{issuer: i, subject: s}]}\n", "engines.vllm.trustedRoot: keyless identities need an offline trusted root"},
		{"identity without subject", "engines:\n  vllm: {mode: required, trustedRoot: r.json, identities: [{issuer: i}]}\n", "engines.vllm.identities[0]: issuer and subject are both required"},
		{"json", `{"engines": {"vllm": {"mode": 3}}}`, `engines.vllm.mode: "3" is neither`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "P")
			_, err := trust.Parse(p, []byte(tc.text))
			want := strings.ReplaceAll(tc.want, "policy P", "policy "+p)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "policy "+p+": ") {
				t.Fatalf("Parse: %v, want %q", err, want)
			}
		})
	}
	for _, ok := range []string{"", "default: {mode: off}\n", "engines:\n  vllm: {mode: required, keys: [ci.pub]}\n"} {
		if _, err := trust.Parse(filepath.Join(dir, "P"), []byte(ok)); err != nil {
			t.Errorf("Parse(%q): %v", ok, err)
		}
	}
}

// keyBundle is a Sigstore bundle as cosign v3's sign --key writes one
// (--new-bundle-format, its default; no transparency log): a DSSE envelope
// of an in-toto statement naming over as its subject, signed by s, the
// verification material the key's hint. predicateType "" is cosign sign's.
func keyBundle(t testing.TB, s signature.Signer, over v1.Hash, predicateType string) []byte {
	t.Helper()
	if predicateType == "" {
		predicateType = trust.SignPredicateType
	}
	stmt, err := json.Marshal(map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"digest": map[string]string{over.Algorithm: over.Hex}}},
		"predicateType": predicateType,
		"predicate":     map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	const payloadType = "application/vnd.in-toto+json"
	sig, err := s.SignMessage(bytes.NewReader(dsse.PAE(payloadType, stmt)))
	if err != nil {
		t.Fatal(err)
	}
	pb := &protobundle.Bundle{
		MediaType: "application/vnd.dev.sigstore.bundle.v0.3+json",
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content: &protobundle.VerificationMaterial_PublicKey{PublicKey: &protocommon.PublicKeyIdentifier{Hint: "a hint gpupin does not trust"}},
		},
		Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{
			Payload: stmt, PayloadType: payloadType, Signatures: []*protodsse.Signature{{Sig: sig}},
		}},
	}
	b, err := (&bundle.Bundle{Bundle: pb}).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestVerifyBundleKey: a Sigstore bundle signed with a key (cosign v3's
// default for cosign sign --key), as an OCI referrer in a real registry,
// verifies against a key rule, for each key type sigstore signs with; a
// bundle by another key, over another digest, corrupted, truncated, or an
// attestation rather than a signature is refused, naming engine, variant
// and why.
func TestVerifyBundleKey(t *testing.T) {
	dir := t.TempDir()
	signer := func(priv crypto.PrivateKey, opts ...signature.LoadOption) signature.Signer {
		s, err := signature.LoadDefaultSigner(priv, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ci := newKey(t, dir, "ci.pub")
	other := newKey(t, dir, "other.pub")
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	edPub, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	trusttest.WritePub(t, dir, "p384.pub", p384.Public())
	trusttest.WritePub(t, dir, "p521.pub", p521.Public())
	trusttest.WritePub(t, dir, "ed.pub", edPub)
	trusttest.WritePub(t, dir, "rsa.pub", rk.Public())
	cases := []struct {
		name, pub string
		body      func(img, img2 v1.Hash) []byte
		want      string // "" = verifies
	}{
		{"P-256 key", "ci.pub", func(img, _ v1.Hash) []byte { return keyBundle(t, signer(ci), img, "") }, ""},
		{"P-384 key, SHA-384", "p384.pub", func(img, _ v1.Hash) []byte { return keyBundle(t, signer(p384), img, "") }, ""},
		{"P-521 key, SHA-512", "p521.pub", func(img, _ v1.Hash) []byte { return keyBundle(t, signer(p521), img, "") }, ""},
		{"Ed25519 key", "ed.pub", func(img, _ v1.Hash) []byte { return keyBundle(t, signer(ed), img, "") }, ""},
		{"Ed25519ph key", "ed.pub", func(img, _ v1.Hash) []byte {
			return keyBundle(t, signer(ed, options.WithED25519ph()), img, "")
		}, ""},
		{"RSA key", "rsa.pub", func(img, _ v1.Hash) []byte { return keyBundle(t, signer(rk), img, "") }, ""},
		{"another key", "ci.pub", func(img, _ v1.Hash) []byte { return keyBundle(t, signer(other), img, "") }, "signature by no trusted key (key ci.pub (sha256:"},
		{"another digest", "ci.pub", func(_, img2 v1.Hash) []byte { return keyBundle(t, signer(ci), img2, "") }, ") signed a statement about another digest: "},
		{"corrupted signature", "ci.pub", func(img, _ v1.Hash) []byte {
			b := keyBundle(t, signer(ci), img, "")
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			sig := m["dsseEnvelope"].(map[string]any)["signatures"].([]any)[0].(map[string]any)
			raw, _ := base64.StdEncoding.DecodeString(sig["sig"].(string))
			raw[len(raw)/2] ^= 0xff
			sig["sig"] = base64.StdEncoding.EncodeToString(raw)
			b, _ = json.Marshal(m)
			return b
		}, "signature by no trusted key"},
		{"corrupted statement", "ci.pub", func(img, _ v1.Hash) []byte {
			b := keyBundle(t, signer(ci), img, "")
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			env := m["dsseEnvelope"].(map[string]any)
			raw, _ := base64.StdEncoding.DecodeString(env["payload"].(string))
			env["payload"] = base64.StdEncoding.EncodeToString([]byte(strings.Replace(string(raw), "cosign/sign", "cosign/sigh", 1)))
			b, _ = json.Marshal(m)
			return b
		}, "signature by no trusted key"},
		{"truncated bundle", "ci.pub", func(img, _ v1.Hash) []byte {
			b := keyBundle(t, signer(ci), img, "")
			return b[:len(b)/2]
		}, "not a Sigstore bundle"},
		{"an attestation, not a signature", "ci.pub", func(img, _ v1.Hash) []byte {
			return keyBundle(t, signer(ci), img, "https://slsa.dev/provenance/v1")
		}, `signed an attestation of predicate type "https://slsa.dev/provenance/v1", not a signature`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pol := trusttest.Policy(t, dir, "engines:\n  vllm:\n    mode: required\n    keys: ["+tc.pub+"]\n")
			g := trusttest.NewRegistry(t, true)
			img, img2 := g.Push(t, "org/vllm"), g.Push(t, "org/vllm")
			h, _ := v1.NewHash(img.DigestStr())
			h2, _ := v1.NewHash(img2.DigestStr())
			pushBundleReferrer(t, img, tc.body(h, h2))
			s, err := (&trust.Verifier{Policy: pol}).Verify(context.Background(), "vllm", "cu13", img.String(), "")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if s == nil || s.Digest != img.DigestStr() || !strings.HasPrefix(s.By, "key "+tc.pub+" (sha256:") {
					t.Fatalf("signature %+v", s)
				}
				return
			}
			if err == nil {
				t.Fatalf("Verify passed, want refusal with %q", tc.want)
			}
			var te *trust.Error
			if !errors.As(err, &te) || te.Engine != "vllm" || te.Variant != "cu13" || errors.Is(err, trust.ErrUnsigned) {
				t.Fatalf("error %v is not a trust.Error naming engine and variant (and not ErrUnsigned)", err)
			}
			t.Logf("refused: %v", err)
			for _, w := range []string{"signature policy refused engine vllm variant cu13", "bundle sha256:", tc.want} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// A key-signed bundle under a rule of keyless identities only is not
	// theirs; one the rule's key made passes beside a bad one.
	t.Run("key bundle, keyless rule", func(t *testing.T) {
		vdir := t.TempDir()
		virtualRoot(t, vdir)
		pol := trusttest.Policy(t, vdir, "default: {mode: required, trustedRoot: trusted_root.json, identities: [{issuer: i, subject: s}]}\n")
		g := trusttest.NewRegistry(t, true)
		img := g.Push(t, "org/vllm")
		h, _ := v1.NewHash(img.DigestStr())
		pushBundleReferrer(t, img, keyBundle(t, signer(ci), h, ""))
		_, err := (&trust.Verifier{Policy: pol}).Verify(context.Background(), "vllm", "cu13", img.String(), "")
		if err == nil || !strings.Contains(err.Error(), "signed with a key, and the rule names no keys") {
			t.Fatalf("Verify: %v", err)
		}
	})
	t.Run("a good bundle beside a bad one", func(t *testing.T) {
		pol := trusttest.Policy(t, dir, "default: {mode: required, keys: [ci.pub]}\n")
		g := trusttest.NewRegistry(t, true)
		img := g.Push(t, "org/vllm")
		h, _ := v1.NewHash(img.DigestStr())
		pushBundleReferrer(t, img, keyBundle(t, signer(other), h, ""))
		pushBundleReferrer(t, img, keyBundle(t, signer(ci), h, ""))
		s, err := (&trust.Verifier{Policy: pol}).Verify(context.Background(), "vllm", "cu13", img.String(), "")
		if err != nil || !strings.HasPrefix(s.By, "key ci.pub (") {
			t.Fatalf("Verify = %+v, %v", s, err)
		}
	})
}
