package runtime_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/runtime"
)

// Where nvidia-container-runtime is not installed, the nvidia-runtime mode
// fails with a message that names it, and leaves nothing behind.
func TestNvidiaRuntimeModeMissingBinary(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, runtime.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := rt.Run(ctx, runtime.RunSpec{Image: ref, Role: "probe", Args: []string{"true"}, Timeout: 30 * time.Second,
		GPUs: runtime.GPUs{Mode: runtime.GPUNvidiaRuntime}})
	if err == nil || !strings.Contains(err.Error(), "nvidia-container-runtime") {
		t.Fatalf("err = %v, want one naming nvidia-container-runtime", err)
	}
	assertNothingLeft(t, rt)
}
