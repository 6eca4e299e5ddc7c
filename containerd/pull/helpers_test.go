package pull_test

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type snapshotInfo = snapshots.Info

func withNS(ctx context.Context, ns string) context.Context { return namespaces.WithNamespace(ctx, ns) }
