package containerd_test

import (
	"context"

	"github.com/opencontainers/go-digest"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

type snapshotInfo = snapshots.Info

const snapshotCommitted = snapshots.KindCommitted

func withNS(ctx context.Context, ns string) context.Context { return namespaces.WithNamespace(ctx, ns) }

func digestOf(s string) digest.Digest { return digest.Digest(s) }
