package images

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// ParseReference parses an image reference. Registries named in insecure are
// reached over plain HTTP; loopback ones always are (go-containerregistry's
// rule).
func ParseReference(ref string, insecure []string) (name.Reference, error) {
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

// EngineFromRepo names an engine from its repository when the image carries
// no io.gpupin.engine: "reg/vllm/vllm-openai" gives "vllm-openai".
func EngineFromRepo(r name.Reference) string {
	repo := r.Context().RepositoryStr()
	if i := strings.LastIndex(repo, "/"); i >= 0 {
		repo = repo[i+1:]
	}
	return repo
}
