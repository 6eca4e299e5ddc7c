package testenv

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/probe"
)

var (
	binsOnce sync.Once
	binsErr  error
)

// NeedProbeBinaries makes gpupin-cuda-probe and gpupin-sim-probe findable
// through GPUPIN_LIBDIR (inherited by a gpupin binary a test runs),
// building them into the package daemon's directory (removed with it)
// unless the harness (Main) already did.
func NeedProbeBinaries(t testing.TB) {
	t.Helper()
	binsOnce.Do(func() {
		if dir := os.Getenv(probe.EnvLibDir); dir != "" {
			if _, err := os.Stat(filepath.Join(dir, probe.SimProbeName)); err == nil {
				return
			}
		}
		dir := filepath.Join(Containerd(t).Dir, "probe-bin")
		if binsErr = sandbox.BuildProbeBinaries(context.Background(), dir); binsErr == nil {
			binsErr = os.Setenv(probe.EnvLibDir, dir)
		}
	})
	if binsErr != nil {
		t.Fatal(binsErr)
	}
}
