package cosign_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sigstore/cosign/v3/cmd/cosign/cli/options"
	"github.com/sigstore/cosign/v3/cmd/cosign/cli/sign"
	"github.com/sigstore/cosign/v3/pkg/cosign"
	ociremote "github.com/sigstore/cosign/v3/pkg/oci/remote"
	sigs "github.com/sigstore/cosign/v3/pkg/signature"

	"github.com/gpupin/gpupin/trust"
	"github.com/gpupin/gpupin/trust/trusttest"
)

const password = "correct horse battery staple"

func pass(bool) ([]byte, error) { return []byte(password), nil }

// cosignKeyPair generates a key pair with cosign's own code (what cosign
// generate-key-pair runs) and writes it as that command does.
func cosignKeyPair(t *testing.T, dir, base string) (keyPath, pubPath string) {
	t.Helper()
	kb, err := cosign.GenerateKeyPair(pass)
	if err != nil {
		t.Fatal(err)
	}
	keyPath, pubPath = filepath.Join(dir, base+".key"), filepath.Join(dir, base+".pub")
	if err := os.WriteFile(keyPath, kb.PrivateBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, kb.PublicBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return keyPath, pubPath
}

// cosignVerify is cosign verify --key PUB --insecure-ignore-tlog: cosign's
// own key loading and VerifyImageSignatures, the claims checked (the
// payload names the digest verified).
func cosignVerify(ctx context.Context, pubPath string, ref name.Reference) (int, error) {
	v, err := sigs.PublicKeyFromKeyRef(ctx, pubPath)
	if err != nil {
		return 0, err
	}
	checked, _, err := cosign.VerifyImageSignatures(ctx, ref, &cosign.CheckOpts{
		SigVerifier:   v,
		ClaimVerifier: cosign.SimpleClaimVerifier,
		IgnoreTlog:    true, // gpupin, like cosign sign --tlog-upload=false, uploads to no log
	})
	return len(checked), err
}

// gpupinPolicy is a required rule trusting pubs.
func gpupinPolicy(t *testing.T, dir string, pubs ...string) *trust.Policy {
	t.Helper()
	return trusttest.Policy(t, dir, "default: {mode: required, keys: ["+strings.Join(pubs, ", ")+"]}\n")
}

// TestGpupinSignsCosignVerifies: what gpupin signs, with a key cosign
// generated, passes cosign's verification with the public key, for a
// variant manifest and an index; another key's check fails, so the
// verification is real; and gpupin's own verifier agrees.
func TestGpupinSignsCosignVerifies(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	keyPath, pubPath := cosignKeyPair(t, dir, "ci")
	_, otherPub := cosignKeyPair(t, dir, "other")
	signer := &trust.Signer{Key: trusttest.LoadSignKey(t, keyPath, password)}
	host := trusttest.NewRegistry(t, false).Host
	idx, child := trusttest.PushIndex(t, host, "org/vllm")
	cases := []struct {
		name string
		ref  name.Digest
	}{
		{"variant manifest", trusttest.PushImage(t, host, "org/sglang")},
		{"index", idx},
		{"index child", child},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := signer.Sign(ctx, tc.ref); err != nil {
				t.Fatal(err)
			}
			n, err := cosignVerify(ctx, pubPath, tc.ref)
			if err != nil || n != 1 {
				t.Fatalf("cosign's VerifyImageSignatures: %d signature(s), %v", n, err)
			}
			if _, err := cosignVerify(ctx, otherPub, tc.ref); err == nil {
				t.Fatal("cosign verified gpupin's signature with another key")
			}
			s, err := (&trust.Verifier{Policy: gpupinPolicy(t, dir, "ci.pub")}).Verify(ctx, "vllm", "cu13", tc.ref.String(), "")
			if err != nil || s.By != signer.Key.Name {
				t.Fatalf("gpupin's verifier: %+v, %v", s, err)
			}
		})
	}
}

// cosignSign is cosign sign --key KEY --tlog-upload=false -y, through
// cosign's own SignCmd.
func cosignSign(ctx context.Context, keyPath string, recursive bool, ref name.Reference) error {
	return sign.SignCmd(ctx, &options.RootOptions{Timeout: time.Minute},
		options.KeyOpts{KeyRef: keyPath, PassFunc: pass, SkipConfirmation: true},
		options.SignOptions{Upload: true, TlogUpload: false, SkipConfirmation: true, Recursive: recursive,
			Registry: options.RegistryOptions{AllowHTTPRegistry: true}},
		[]string{ref.String()})
}

// TestCosignSignsGpupinVerifies: what cosign's own signing code writes
// passes gpupin's verifier: a manifest, and an index signed with
// --recursive, whose children are what nodes verify. gpupin's signature
// added beside cosign's keeps it: cosign then finds both.
func TestCosignSignsGpupinVerifies(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	keyPath, pubPath := cosignKeyPair(t, dir, "cosign")
	gpKey, _ := cosignKeyPair(t, dir, "gpupin")
	host := trusttest.NewRegistry(t, false).Host
	pol := gpupinPolicy(t, dir, "cosign.pub")
	idx, child := trusttest.PushIndex(t, host, "org/vllm")
	img := trusttest.PushImage(t, host, "org/sglang")
	unsigned := trusttest.PushImage(t, host, "org/vllm") // stands in for a manifest only the index names
	cases := []struct {
		name      string
		sign      name.Digest // what cosign signs
		recursive bool
		verify    name.Digest // what the node verifies
		index     string      // the index digest it passes
		by        name.Digest // whose signature passes
	}{
		{"manifest", img, false, img, "", img},
		{"index, recursive: the child", idx, true, child, "", child},
		{"index: a signature over the index counts", idx, false, unsigned, idx.DigestStr(), idx},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := cosignSign(ctx, keyPath, tc.recursive, tc.sign); err != nil {
				t.Fatalf("cosign's SignCmd: %v", err)
			}
			s, err := (&trust.Verifier{Policy: pol}).Verify(ctx, "vllm", "cu13", tc.verify.String(), tc.index)
			if err != nil {
				t.Fatalf("gpupin's verifier on cosign's signature: %v", err)
			}
			if !strings.HasPrefix(s.By, "key cosign.pub (sha256:") || s.Digest != tc.by.DigestStr() {
				t.Fatalf("verified %+v; want by cosign.pub over %s", s, tc.by.DigestStr())
			}
		})
	}
	t.Run("gpupin appends to cosign's", func(t *testing.T) {
		if _, err := (&trust.Signer{Key: trusttest.LoadSignKey(t, gpKey, password)}).Sign(ctx, img); err != nil {
			t.Fatal(err)
		}
		for _, pub := range []string{pubPath, filepath.Join(dir, "gpupin.pub")} {
			if n, err := cosignVerify(ctx, pub, img); err != nil || n != 1 {
				t.Fatalf("cosign verify --key %s: %d, %v", filepath.Base(pub), n, err)
			}
		}
		se, err := ociremote.SignedEntity(img)
		if err != nil {
			t.Fatal(err)
		}
		sl, err := se.Signatures()
		if err != nil {
			t.Fatal(err)
		}
		all, err := sl.Get()
		if err != nil || len(all) != 2 {
			t.Fatalf("cosign reads %d signatures (%v); want cosign's and gpupin's", len(all), err)
		}
		// And cosign, signing again, appends to gpupin's image in turn.
		if err := cosignSign(ctx, keyPath, false, img); err != nil {
			t.Fatal(err)
		}
		if _, err := (&trust.Verifier{Policy: gpupinPolicy(t, dir, "gpupin.pub")}).Verify(ctx, "vllm", "cu13", img.String(), ""); err != nil {
			t.Fatalf("gpupin's signature after cosign signed again: %v", err)
		}
	})
}

// TestCosignKeyLoads: keys cosign generated (generate-key-pair) and
// imported (import-key-pair) load in gpupin under their password, to the
// public key cosign wrote; a wrong password is ErrWrongPassword.
func TestCosignKeyLoads(t *testing.T) {
	dir := t.TempDir()
	generated, _ := cosignKeyPair(t, dir, "gen")
	// import-key-pair: a plain PEM key (what openssl ecparam -genkey
	// writes), re-encrypted in cosign's format by cosign.
	plain := filepath.Join(dir, "plain.pem")
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	imported, err := cosign.ImportKeyPair(plain, pass)
	if err != nil {
		t.Fatal(err)
	}
	importedPath := filepath.Join(dir, "imported.key")
	if err := os.WriteFile(importedPath, imported.PrivateBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "imported.pub"), imported.PublicBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, password string
		wrong                bool
	}{
		{"generate-key-pair", generated, password, false},
		{"import-key-pair", importedPath, password, false},
		{"wrong password", generated, "hunter2", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := os.ReadFile(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			k, err := trust.LoadSignKey(tc.path, raw, []byte(tc.password))
			if tc.wrong {
				if !errors.Is(err, trust.ErrWrongPassword) {
					t.Fatalf("LoadSignKey: %v; want ErrWrongPassword", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The key gpupin loaded is the pair's: the policy naming the
			// .pub cosign wrote gives the same fingerprint.
			pub := strings.TrimSuffix(filepath.Base(tc.path), ".key") + ".pub"
			if got := gpupinPolicy(t, dir, pub).For("x").Keys[0].Name; got != k.Name {
				t.Fatalf("gpupin names the key %q, the policy names %s %q", k.Name, pub, got)
			}
			// And cosign's own loader agrees the file is its format.
			if _, err := cosign.LoadPrivateKey(raw, []byte(tc.password), nil); err != nil {
				t.Fatalf("cosign's LoadPrivateKey: %v", err)
			}
		})
	}
}
