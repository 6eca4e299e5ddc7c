package cosign_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/sigstore/cosign/v3/cmd/cosign/cli/options"
	"github.com/sigstore/cosign/v3/cmd/cosign/cli/sign"
	"github.com/sigstore/cosign/v3/cmd/cosign/cli/signcommon"
	"github.com/sigstore/cosign/v3/pkg/cosign"
	sigs "github.com/sigstore/cosign/v3/pkg/signature"
	"github.com/spf13/cobra"

	"github.com/gpupin/gpupin/trust"
	"github.com/gpupin/gpupin/trust/trusttest"
)

// cosignSignCLI is `cosign sign ARGS…` as cosign v3.1.3's CLI runs it:
// its sign flags with their defaults (--new-bundle-format, --upload,
// --tlog-upload and --use-signing-config all true), args parsed over
// them, then what the command's PreRunE and RunE do
// (signcommon.LoadTrustedMaterialAndSigningConfig, then sign.SignCmd).
// The password comes from pass, as COSIGN_PASSWORD would give it.
func cosignSignCLI(ctx context.Context, args ...string) error {
	o := &options.SignOptions{}
	cmd := &cobra.Command{Use: "sign"}
	o.AddFlags(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		return err
	}
	if o.NewBundleFormat && !o.Upload && o.BundlePath == "" {
		return errors.New("must enable upload to the OCI registry or specify a local --bundle path with --new-bundle-format")
	}
	ko := options.KeyOpts{
		KeyRef:                         o.Key,
		PassFunc:                       pass,
		FulcioURL:                      o.Fulcio.URL,
		RekorURL:                       o.Rekor.URL,
		OIDCIssuer:                     o.OIDC.Issuer,
		SkipConfirmation:               o.SkipConfirmation,
		TSAServerURL:                   o.TSAServerURL,
		IssueCertificateForExistingKey: o.IssueCertificate,
		NewBundleFormat:                o.NewBundleFormat,
	}
	if err := signcommon.LoadTrustedMaterialAndSigningConfig(ctx, &ko, o.UseSigningConfig, o.SigningConfigPath,
		o.Rekor.URL, o.Fulcio.URL, o.OIDC.Issuer, o.TSAServerURL, o.TrustedRootPath, o.TlogUpload,
		o.NewBundleFormat, "", o.Key, o.IssueCertificate, o.Output, "", o.OutputCertificate, o.OutputPayload, o.OutputSignature, ""); err != nil {
		return err
	}
	return sign.SignCmd(ctx, &options.RootOptions{Timeout: time.Minute}, ko, *o, cmd.Flags().Args())
}

// cosignOffline are the flags that let cosign v3's default signing path
// (a Sigstore bundle, pushed as an OCI referrer) run with a key and no
// network: no transparency log upload, and so no signing config from
// Sigstore's TUF repository (cosign refuses --tlog-upload=false with one).
// The bundle format stays cosign's default.
var cosignOffline = []string{"--tlog-upload=false", "--use-signing-config=false", "--allow-http-registry", "-y"}

// cosignVerifyBundle is cosign verify --key PUB --insecure-ignore-tlog on
// the new bundle format: cosign's own VerifyImageAttestations over the
// referrers, the in-toto subject checked against the digest.
func cosignVerifyBundle(ctx context.Context, pubPath string, ref name.Reference) (int, error) {
	v, err := sigs.PublicKeyFromKeyRef(ctx, pubPath)
	if err != nil {
		return 0, err
	}
	checked, _, err := cosign.VerifyImageAttestations(ctx, ref, &cosign.CheckOpts{
		SigVerifier:     v,
		ClaimVerifier:   cosign.IntotoSubjectClaimVerifier,
		IgnoreTlog:      true,
		NewBundleFormat: true,
	}, name.Insecure)
	return len(checked), err
}

// importedKeyPair writes priv as cosign import-key-pair writes it, with
// cosign's own code, and returns the .key and .pub paths.
func importedKeyPair(t *testing.T, dir, base string, priv crypto.Signer) (string, string) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, base+".pem")
	if err := os.WriteFile(plain, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	kb, err := cosign.ImportKeyPair(plain, pass)
	if err != nil {
		t.Fatal(err)
	}
	keyPath, pubPath := filepath.Join(dir, base+".key"), filepath.Join(dir, base+".pub")
	if err := os.WriteFile(keyPath, kb.PrivateBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, kb.PublicBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return keyPath, pubPath
}

// TestCosignV3BundleGpupinVerifies: what cosign v3's sign writes with its
// defaults and a key (a Sigstore bundle as an OCI referrer, no .sig tag;
// offline, so no transparency log entry) passes gpupin's verifier for the
// policy naming the key, on a registry with the referrers API and on one
// without (go-containerregistry's fallback tag), for a manifest and an
// index signed --recursive, with keys of the types cosign signs with;
// cosign's own verification agrees; another key's policy refuses it.
func TestCosignV3BundleGpupinVerifies(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	keyPath, pubPath := cosignKeyPair(t, dir, "cosign")
	cosignKeyPair(t, dir, "other")
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384Key, p384Pub := importedKeyPair(t, dir, "p384", p384)
	edKey, edPub := importedKeyPair(t, dir, "ed25519", ed)
	for _, referrers := range []bool{true, false} {
		srv := httptest.NewServer(registry.New(registry.WithReferrersSupport(referrers), registry.Logger(log.New(io.Discard, "", 0))))
		t.Cleanup(srv.Close)
		host := strings.TrimPrefix(srv.URL, "http://")
		idx, child := trusttest.PushIndex(t, host, "org/vllm")
		cases := []struct {
			name          string
			key, pub      string
			sign          name.Digest
			recursive     bool
			verify        name.Digest
			cosignVerifys bool
		}{
			{"manifest", keyPath, pubPath, trusttest.PushImage(t, host, "org/sglang"), false, name.Digest{}, true},
			{"index, recursive: the child", keyPath, pubPath, idx, true, child, true},
			{"P-384 key", p384Key, p384Pub, trusttest.PushImage(t, host, "org/sglang"), false, name.Digest{}, true},
			// cosign signs Ed25519 bundles with Ed25519ph, and its own
			// verify loads the public key as pure Ed25519: it refuses
			// them, gpupin (which tries both) does not.
			{"Ed25519 key", edKey, edPub, trusttest.PushImage(t, host, "org/sglang"), false, name.Digest{}, false},
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("referrers API %v/%s", referrers, tc.name), func(t *testing.T) {
				if tc.verify == (name.Digest{}) {
					tc.verify = tc.sign
				}
				args := append([]string{"--key", tc.key, fmt.Sprintf("--recursive=%v", tc.recursive)}, cosignOffline...)
				if err := cosignSignCLI(ctx, append(args, tc.sign.String())...); err != nil {
					t.Fatalf("cosign sign: %v", err)
				}
				// It is the bundle gpupin verifies: there is no classic signature.
				h, _ := v1.NewHash(tc.verify.DigestStr())
				_, err := remote.Head(tc.verify.Context().Tag(fmt.Sprintf("%s-%s.sig", h.Algorithm, h.Hex)))
				var te *transport.Error
				if !errors.As(err, &te) || te.StatusCode != http.StatusNotFound {
					t.Fatalf("cosign wrote a classic .sig tag too (%v); want only its bundle", err)
				}
				refs, err := remote.Referrers(tc.verify)
				if err != nil {
					t.Fatal(err)
				}
				// go-containerregistry's registry lists a referrer's config
				// media type (the OCI empty one) as its artifactType; its
				// client's fallback tag lists the manifest's, the bundle's.
				im, _ := refs.IndexManifest()
				if len(im.Manifests) != 1 || im.Manifests[0].Annotations["dev.sigstore.bundle.content"] != "dsse-envelope" {
					t.Fatalf("referrers %+v; want cosign's one Sigstore bundle", im.Manifests)
				}
				if at := im.Manifests[0].ArtifactType; referrers && at != "application/vnd.oci.empty.v1+json" || !referrers && !strings.HasPrefix(at, trust.BundleArtifactPrefix) {
					t.Fatalf("referrer listed with artifactType %q", at)
				}
				if n, err := cosignVerifyBundle(ctx, tc.pub, tc.verify); tc.cosignVerifys != (err == nil && n == 1) {
					t.Fatalf("cosign's VerifyImageAttestations: %d, %v; want it to pass: %v", n, err, tc.cosignVerifys)
				}
				pub := filepath.Base(tc.pub)
				s, err := (&trust.Verifier{Policy: gpupinPolicy(t, dir, pub)}).Verify(ctx, "vllm", "cu13", tc.verify.String(), "")
				if err != nil {
					t.Fatalf("gpupin's verifier on cosign v3's bundle: %v", err)
				}
				if !strings.HasPrefix(s.By, "key "+pub+" (sha256:") || s.Digest != tc.verify.DigestStr() {
					t.Fatalf("verified %+v; want by %s over %s", s, pub, tc.verify.DigestStr())
				}
				_, err = (&trust.Verifier{Policy: gpupinPolicy(t, dir, "other.pub")}).Verify(ctx, "vllm", "cu13", tc.verify.String(), "")
				if err == nil || !strings.Contains(err.Error(), "signature policy refused engine vllm variant cu13") || !strings.Contains(err.Error(), "signature by no trusted key") {
					t.Fatalf("another key's policy: %v", err)
				}
			})
		}
	}
}
