package main

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

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/trust"
)

// plan --trust-policy says, per candidate, whether it would pass: cu13
// signed by the trusted key passes, cu129 unsigned is refused with why; a
// policy that does not parse is a usage error naming the file and field.
func TestPlanTrustPolicySimulated(t *testing.T) {
	w := newChoiceWorld(t)
	h580 := w.nodeFile(t, "h580", factsH100on580)
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err := os.WriteFile(filepath.Join(w.dir, "ci.pub"), pem, 0o644); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(w.dir, "trust.yaml")
	if err := os.WriteFile(pol, []byte("engines:\n  vllm: {mode: required, keys: [ci.pub]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := (&images.Resolver{}).Resolve(context.Background(), w.engine)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range set.Variants {
		if v.Variant == "cu13" {
			signForTest(t, priv, v.Ref)
		}
	}
	ovPath := filepath.Join(w.dir, "none.yaml")
	out, msg, code := choiceRun(t, "--overrides", ovPath, "plan", w.engine, "--node", h580, "--trust-policy", pol)
	if code != exitOK {
		t.Fatalf("exit %d (%s): %s", code, msg, out)
	}
	for _, want := range []string{"signature policy (required):", "cu13: passes, signed by key ci.pub (sha256:", "cu129: REFUSED: signature policy refused engine vllm variant cu129", "no signature"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	out, msg, code = choiceRun(t, "--overrides", ovPath, "plan", w.engine, "--node", h580, "--trust-policy", pol, "--json")
	var p struct {
		Candidates []any                `json:"candidates"`
		Signatures []candidateSignature `json:"signatures"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &p) != nil || len(p.Candidates) != 2 || len(p.Signatures) != 2 ||
		!p.Signatures[0].Pass || p.Signatures[1].Pass {
		t.Fatalf("plan --json (exit %d, %s): %s", code, msg, out)
	}

	bad := filepath.Join(w.dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("engines:\n  vllm: {mode: requird}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, msg, code = choiceRun(t, "--overrides", ovPath, "plan", w.engine, "--node", h580, "--trust-policy", bad)
	if code != exitUsage || !strings.Contains(msg, "policy "+bad+": engines.vllm.mode:") {
		t.Fatalf("bad policy: exit %d, %q", code, msg)
	}
}

// signForTest writes cosign's classic signature of ref, as cosign sign --key.
func signForTest(t *testing.T, priv *ecdsa.PrivateKey, ref string) {
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
	tag := d.Context().Tag(fmt.Sprintf("sha256-%s.sig", strings.TrimPrefix(d.DigestStr(), "sha256:")))
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
}
