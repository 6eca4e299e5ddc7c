package provision

import (
	"context"
	"errors"

	"github.com/gpupin/gpupin/containerd"
)

// Verifier checks a candidate's signature before it is pulled, so nothing
// unverified runs on the node, the probe included (trust.Verifier is the
// implementation; tests may give their own).
type Verifier interface {
	// Verify checks ref (repo@sha256:…) for engine's policy; index is the
	// digest of the index it was chosen from, or "". nil, nil: the policy
	// asks for nothing.
	Verify(ctx context.Context, engine, variant, ref, index string) (*containerd.Signature, error)
}

// WithVerifier makes every candidate pass v before its pull. A refusal is
// an Attempt of Stage "verify"; under auto the next candidate is tried,
// as after a failed probe, and the key's pin is untouched.
func WithVerifier(v Verifier) Option {
	return func(c *config) error {
		if v == nil {
			return errors.New("WithVerifier(nil): leave the option out for no signature policy")
		}
		c.Verifier = v
		return nil
	}
}
