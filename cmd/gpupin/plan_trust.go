package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/trust"
)

// candidateSignature is whether a candidate would pass --trust-policy.
type candidateSignature struct {
	Variant string `json:"variant"`
	Ref     string `json:"ref"`
	Pass    bool   `json:"pass"`
	By      string `json:"by,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// candidateSignatures checks every candidate as provision would before
// its pull; nil when no policy was given or it requires nothing here.
func candidateSignatures(ctx context.Context, v *trust.Verifier, pl *provision.Plan) []candidateSignature {
	if v == nil || !v.Required(pl.Engine) {
		return nil
	}
	out := []candidateSignature{}
	for _, cand := range pl.Candidates {
		cs := candidateSignature{Variant: cand.Variant, Ref: cand.Ref}
		s, err := v.Verify(ctx, pl.Engine, cand.Variant, cand.Ref, pl.Index)
		switch {
		case err != nil:
			cs.Reason = err.Error()
		case s != nil:
			cs.Pass, cs.By = true, s.By
		}
		out = append(out, cs)
	}
	return out
}

func writeSignatures(w io.Writer, sigs []candidateSignature) {
	if sigs == nil {
		return
	}
	fmt.Fprintln(w, "signature policy (required):")
	for _, s := range sigs {
		if s.Pass {
			fmt.Fprintf(w, "  %s: passes, signed by %s\n", s.Variant, s.By)
		} else {
			fmt.Fprintf(w, "  %s: REFUSED: %s\n", s.Variant, s.Reason)
		}
	}
}
