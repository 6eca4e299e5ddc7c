package containerd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

// Where nvidia-container-runtime is not installed, the nvidia-runtime mode
// fails with a message that names it, and leaves nothing behind.
func TestNvidiaRuntimeModeMissingBinary(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", Args: []string{"true"}, Timeout: 30 * time.Second,
		GPUs: containerd.GPUs{Mode: containerd.GPUNvidiaRuntime}})
	if err == nil || !strings.Contains(err.Error(), "nvidia-container-runtime") {
		t.Fatalf("err = %v, want one naming nvidia-container-runtime", err)
	}
	assertNothingLeft(t, rt)
}
