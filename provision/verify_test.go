package provision_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/trust"
)

// cosignKey makes a key pair and a required policy for engine demo that
// trusts it.
func cosignKey(t *testing.T) (*ecdsa.PrivateKey, *trust.Policy) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ci.pub"), pem, 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := trust.Parse(filepath.Join(dir, "policy.yaml"), []byte("engines:\n  demo: {mode: required, keys: [ci.pub]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return priv, pol
}

// signRef writes cosign's classic signature of ref (repo@sha256:…).
func signRef(t *testing.T, priv *ecdsa.PrivateKey, ref string) {
	t.Helper()
	d, err := name.NewDigest(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(payload.Cosign{Image: d})
	s, err := signature.LoadSigner(priv, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := s.SignMessage(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer:       static.NewLayer(body, "application/vnd.dev.cosign.simplesigning.v1+json"),
		Annotations: map[string]string{trust.AnnotationSignature: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatal(err)
	}
	hex := strings.TrimPrefix(d.DigestStr(), "sha256:")
	if err := remote.Write(d.Context().Tag(fmt.Sprintf("sha256-%s.sig", hex)), img); err != nil {
		t.Fatal(err)
	}
}

// Required policy, cu13 (first choice) unsigned, cu129 signed: cu13 is
// refused at verify before anything of it is pulled, cu129 is pinned with
// its signer on the record; then a policy nothing passes fails and leaves
// that pin as it was.
func TestProvisionSimulatedSignaturePolicy(t *testing.T) {
	ctx := context.Background()
	priv, pol := cosignKey(t)
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{cu13, cu129},
		provision.WithVerifier(&trust.Verifier{Policy: pol}))
	signed := e.childRef(t, "cu129")
	signRef(t, priv, signed)

	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if st.State != provision.Ready || st.Variant != "cu129" || st.Pinned != signed {
		t.Fatalf("state %s variant %s: %s", st.State, st.Variant, st.Detail)
	}
	if len(st.Attempts) != 1 || st.Attempts[0].Variant != "cu13" || st.Attempts[0].Stage != "verify" ||
		!strings.Contains(st.Attempts[0].Reason, "engine demo variant cu13") || !strings.Contains(st.Attempts[0].Reason, "no signature") {
		t.Fatalf("attempts = %+v; want cu13 refused at verify, naming engine, variant and why", st.Attempts)
	}
	// Refused before the pull: no record of cu13 was ever made.
	if _, err := e.rt.Client().ImageService().Get(testenv.Context(e.rt), e.childRef(t, "cu13")); err == nil {
		t.Error("the unsigned cu13 was pulled")
	}
	pins, err := e.rt.ListPins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != 1 || pins[0].Signed == nil || pins[0].Signed.Mode != "required" ||
		!strings.HasPrefix(pins[0].Signed.By, "key ci.pub (sha256:") || pins[0].Signed.Digest != pins[0].Digest || pins[0].Signed.At.IsZero() {
		t.Fatalf("pins = %+v; want the signer on the record", pins)
	}

	// Another key's policy: every candidate is refused, the pin stays.
	_, strict := cosignKey(t)
	p2 := testenv.Provisioner(t, e.rt, testOptions(t, e.node, provision.WithVerifier(&trust.Verifier{Policy: strict}))...)
	st = p2.Provision(ctx, provision.Want{Ref: e.ref, Override: "cu13"})
	after, err := e.rt.ListPins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != provision.Failed || !slices.EqualFunc(pins, after, func(a, b containerd.Pin) bool {
		return a.Ref == b.Ref && a.Digest == b.Digest && *a.Signed == *b.Signed
	}) {
		t.Fatalf("%s; pins %+v, were %+v", st, after, pins)
	}
	if len(st.Attempts) != 1 || st.Attempts[0].Stage != "verify" || !strings.Contains(st.Attempts[0].Reason, "variant cu13") {
		t.Fatalf("attempts = %+v", st.Attempts)
	}
	assertNoLeftovers(t, e.rt)
}

// A signature over the index the variants were chosen from covers them:
// the index names each manifest by digest. Nothing else is signed; the
// first choice is pinned, its record naming the index's digest as what
// was verified.
func TestProvisionSimulatedSignedIndex(t *testing.T) {
	ctx := context.Background()
	priv, pol := cosignKey(t)
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{cu13, cu129},
		provision.WithVerifier(&trust.Verifier{Policy: pol}))
	tag, err := name.ParseReference(e.ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(tag)
	if err != nil {
		t.Fatal(err)
	}
	index := tag.Context().Digest(desc.Digest.String())
	signRef(t, priv, index.String())

	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if st.State != provision.Ready || st.Variant != "cu13" {
		t.Fatalf("state %s variant %s: %s (attempts %+v)", st.State, st.Variant, st.Detail, st.Attempts)
	}
	pins, err := e.rt.ListPins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pins) != 1 || pins[0].Signed == nil || pins[0].Signed.Digest != desc.Digest.String() {
		t.Fatalf("pins = %+v; want the index's digest %s as what was verified", pins, desc.Digest)
	}
}
