package run_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestCDIInjectionSeenInside(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	specDir := t.TempDir()
	spec := `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      deviceNodes:
        - path: /dev/gpupin-test0
          hostPath: /dev/null
      env:
        - GPUPIN_CDI_TEST=injected
`
	os.WriteFile(filepath.Join(specDir, "nvidia.yaml"), []byte(spec), 0o644)
	rt := testenv.Runtime(t, containerd.WithCDISpecDirs(specDir))
	ref := ctrtest.Pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", Hardened: true, Timeout: 30 * time.Second,
		GPUs: containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{containerd.DefaultCDIDevice}},
		Args: []string{"/bin/sh", "-c", "echo env=$GPUPIN_CDI_TEST; ls /dev/gpupin-test0"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	if out := string(res.Output); !strings.Contains(out, "env=injected") || !strings.Contains(out, "/dev/gpupin-test0") {
		t.Fatalf("CDI edits not seen inside:\n%s", out)
	}

	// A device no spec describes is refused with the command that makes one.
	_, err = rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", GPUs: containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"nvidia.com/gpu=7"}}, Args: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "nvidia-ctk cdi generate") {
		t.Fatalf("err = %v, want one naming nvidia-ctk cdi generate", err)
	}
	ctrtest.AssertNothingLeft(t, rt)
}

func TestParseGPUs(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		devices []string
		want    containerd.GPUs
		wantErr bool
	}{
		{"", nil, containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{containerd.DefaultCDIDevice}}, false},
		{"cdi", []string{"0,1", "GPU-abc", " "}, containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-abc"}}, false},
		{"cdi", []string{"vendor.com/dev=x", "all"}, containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{"vendor.com/dev=x", "nvidia.com/gpu=all"}}, false},
		{"nvidia-runtime", []string{"0,1"}, containerd.GPUs{Mode: containerd.GPUNvidiaRuntime, Devices: []string{"0,1"}}, false},
		{"none", []string{"0"}, containerd.GPUs{Mode: containerd.GPUNone}, false},
		{"CDI", nil, containerd.GPUs{}, true},
		{"docker", nil, containerd.GPUs{}, true},
	} {
		got, err := containerd.ParseGPUs(tc.mode, tc.devices)
		if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseGPUs(%q, %q) = %+v, %v; want %+v (error %v)", tc.mode, tc.devices, got, err, tc.want, tc.wantErr)
		}
	}
}
