package build

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// parseRef parses a reference for go-containerregistry's remote, which CI
// commands push and read through. The scheme is not decided here: the
// registry policy's transport (registry.Policy.Transport) decides it, as
// it does for nodes.
func parseRef(ref string) (name.Reference, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, fmt.Errorf("empty image reference")
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w (want registry/repository:tag or registry/repository@sha256:…)", ref, err)
	}
	return r, nil
}
