// Package conn is what containerd's pull engine (pull), pin store (pins)
// and runs (run) share: one connection to one namespace (Conn), the labels
// that mark what gpupin made and who made it (labels.go, owner.go), leases
// (WithLease), cleanups that outlast a cancelled caller (Cleanup), and the
// refusal of a record repointed outside gpupin (Tampered).
//
// It sits below the three, so they need not import one another; the front
// (package containerd) builds a Conn in Connect and hands it to each. Each
// keeps it in an unexported field, not embedded, so that a part exports
// its own methods and not the connection's.
package conn

import (
	"context"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/registry"
)

// Conn is a connection to one containerd namespace and how it is used.
type Conn struct {
	Client      *client.Client
	Namespace   string
	Snapshotter string
	// Registry is how registries are reached: the policy manifest
	// resolution uses too, so that what is resolved is what is pulled.
	Registry *registry.Policy
}

// Ctx is ctx in the connection's namespace.
func (c *Conn) Ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, c.Namespace)
}
