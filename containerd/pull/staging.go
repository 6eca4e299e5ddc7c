package pull

import (
	"context"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/transfer"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// stagingResolver resolves and fetches the staging name as the real
// reference, so containerd's Pull names its record after the staging name.
// It also checks the root's media type (see checkMediaType): the resolve
// is the first thing a pull does, so a refusal there fetches nothing more.
type stagingResolver struct {
	remotes.Resolver
	alias, real string
	mediaType   string // expected; "" = any
	refused     error  // set when the root's media type was refused
}

func (s *stagingResolver) Resolve(ctx context.Context, ref string) (string, ocispec.Descriptor, error) {
	if ref != s.alias {
		return s.Resolver.Resolve(ctx, ref)
	}
	_, desc, err := s.Resolver.Resolve(ctx, s.real)
	if err == nil {
		if err = checkMediaType(s.real, s.mediaType, desc.MediaType); err != nil {
			s.refused = err
		}
	}
	return s.alias, desc, err
}

func (s *stagingResolver) Fetcher(ctx context.Context, ref string) (remotes.Fetcher, error) {
	if ref == s.alias {
		ref = s.real
	}
	return s.Resolver.Fetcher(ctx, ref)
}

// SetOptions passes Pull's download options (concurrency) on.
func (s *stagingResolver) SetOptions(opts ...transfer.ImageResolverOption) {
	if r, ok := s.Resolver.(remotes.ResolverWithOptions); ok {
		r.SetOptions(opts...)
	}
}
