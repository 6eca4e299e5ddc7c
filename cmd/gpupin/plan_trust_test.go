package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/trust/trusttest"
)

// plan --trust-policy says, per candidate, whether it would pass: cu13
// signed by the trusted key passes, cu129 unsigned is refused with why; a
// policy that does not parse is a usage error naming the file and field.
func TestPlanTrustPolicySimulated(t *testing.T) {
	w := newChoiceWorld(t)
	h580 := w.nodeFile(t, "h580", factsH100on580)
	priv := trusttest.P256(t)
	trusttest.WritePub(t, w.dir, "ci.pub", priv.Public())
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
			d, err := name.NewDigest(v.Ref, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			trusttest.SignClassic(t, priv, d, d, nil)
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
