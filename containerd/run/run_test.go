package run_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestRunTimeoutLeavesNothing(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", "echo started; sleep 600"}, Hardened: true, Role: "probe", Timeout: time.Second})
	if !errors.Is(err, containerd.ErrTimeout) || !res.TimedOut {
		t.Fatalf("err = %v, timed out %v; want a timeout", err, res.TimedOut)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("timeout took %s", time.Since(start))
	}
	if !strings.Contains(string(res.Output), "started") {
		t.Errorf("output before the kill is lost: %q", res.Output)
	}
	ctrtest.AssertNothingLeft(t, rt)
}

func TestRunOutputIsCapped(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", OutputLimit: 4096, Timeout: 30 * time.Second,
		Args: []string{"/bin/sh", "-c", "dd if=/dev/zero bs=1024 count=2048 2>/dev/null | tr '\\0' x; echo; echo LAST-LINE"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Output) > 4096 || !res.Truncated || !strings.HasSuffix(strings.TrimSpace(string(res.Output)), "LAST-LINE") {
		t.Fatalf("kept %d bytes, truncated %v, tail %q", len(res.Output), res.Truncated, tail(res.Output))
	}
}

func tail(b []byte) string {
	if len(b) > 80 {
		b = b[len(b)-80:]
	}
	return string(b)
}
