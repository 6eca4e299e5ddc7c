package pull_test

import (
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type snapshotInfo = snapshots.Info
