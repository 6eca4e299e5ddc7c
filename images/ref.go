package images

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"
)

// Reference is an image reference in the form containerd, CRI and kubelet
// use: docker.io/library/busybox:latest, registry:5000/org/vllm@sha256:….
// Pins and the records replicas start from are named so, whatever form
// was typed.
type Reference struct {
	named reference.Named
	// given is the reference as written (spaces trimmed), for what a
	// resolve tells the user back (Set.Ref): they should recognise it.
	given string
}

// ParseReference parses and normalises an image reference ("busybox" is
// docker.io/library/busybox:latest). A reference with a tag and a digest
// keeps the digest: the digest is what is pulled.
func ParseReference(s string) (Reference, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Reference{}, fmt.Errorf("empty image reference")
	}
	n, err := reference.ParseDockerRef(s)
	if err != nil {
		return Reference{}, fmt.Errorf("image reference %q: %w (want registry/repository:tag or registry/repository@sha256:…)", s, err)
	}
	return Reference{named: n, given: s}, nil
}

// String is the normalised reference.
func (r Reference) String() string {
	if r.named == nil {
		return ""
	}
	return r.named.String()
}

// Repo is the repository with its registry: registry:5000/org/vllm.
func (r Reference) Repo() string { return r.named.Name() }

// Host is the registry: registry:5000, docker.io.
func (r Reference) Host() string { return reference.Domain(r.named) }

// Tag is the tag, or "" for a digested reference.
func (r Reference) Tag() string {
	if t, ok := r.named.(reference.Tagged); ok {
		return t.Tag()
	}
	return ""
}

// Digest is the digest, or "" for a tagged reference.
func (r Reference) Digest() string {
	if d, ok := r.named.(reference.Digested); ok {
		return d.Digest().String()
	}
	return ""
}

// Identifier is the tag, else the digest.
func (r Reference) Identifier() string {
	if t := r.Tag(); t != "" {
		return t
	}
	return r.Digest()
}

// AtDigest names a manifest of the same repository by digest.
func (r Reference) AtDigest(digest string) string { return r.Repo() + "@" + digest }

// EngineFromRepo names an engine from its repository when the image carries
// no io.gpupin.engine: "reg/vllm/vllm-openai" gives "vllm-openai".
func EngineFromRepo(r Reference) string {
	p := reference.Path(r.named)
	if i := strings.LastIndex(p, "/"); i >= 0 {
		p = p[i+1:]
	}
	return p
}
