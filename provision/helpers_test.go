package provision_test

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/namespaces"
)

func withNamespace(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}
