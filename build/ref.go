package build

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// parseRef parses a reference for go-containerregistry's remote, which CI
// commands push and read through. Registries named insecure are reached
// over plain HTTP; loopback ones always are.
func parseRef(ref string, insecure []string) (name.Reference, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, fmt.Errorf("empty image reference")
	}
	var opts []name.Option
	for _, h := range insecure {
		if strings.HasPrefix(ref, h+"/") {
			opts = append(opts, name.Insecure)
		}
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w (want registry/repository:tag or registry/repository@sha256:…)", ref, err)
	}
	return r, nil
}
