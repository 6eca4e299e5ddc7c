package containerd

import (
	"context"

	"github.com/containerd/containerd/v2/core/remotes"

	"github.com/gpupin/gpupin/registry"
)

// resolver is containerd's docker resolver under the runtime's registry
// policy: the same mirrors, TLS, plain-HTTP rule, credentials and bounds
// as manifest resolution.
func (r *Runtime) resolver(ctx context.Context) remotes.Resolver {
	return r.registry.Resolver(ctx)
}

// Registry is the policy pulls go through.
func (r *Runtime) Registry() *registry.Policy { return r.registry }
