package pull

import (
	"context"

	"github.com/containerd/containerd/v2/core/remotes"
)

// resolver is containerd's docker resolver under the connection's registry
// policy: the same mirrors, TLS, plain-HTTP rule, credentials and bounds
// as manifest resolution.
func (r *Puller) resolver(ctx context.Context) remotes.Resolver {
	return r.conn.Registry.Resolver(ctx)
}
