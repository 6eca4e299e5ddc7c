package faults

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// The disk under containerd fills up: during unpack (a layer that is small
// compressed and large unpacked) and during the fetch (a layer larger than
// the disk). Each fails with the reason and leaves the pin as it was.
func TestFaultDiskFullSimulated(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount a 64 MiB tmpfs: %v", err)
	}
	// Registered first, so it runs after the daemon is stopped.
	t.Cleanup(func() {
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
	_, rt := testenv.OwnContainerd(t, sandbox.ContainerdOptions{Root: root})
	reg := testenv.Registry(t)
	nodes := testenv.NewNode(h100("580.82.07"))
	p := newProvisioner(t, rt, nodes, 0)
	ref := publish(t, reg, "demo", cu129)
	mustReady(t, p.Provision(ctx, provision.Want{Ref: ref}))
	before := pins(t, rt)

	zeros, err := sandbox.FileLayer(map[string][]byte{"model/weights.bin": make([]byte, 96<<20)})
	if err != nil {
		t.Fatal(err)
	}
	random, err := sandbox.RandomLayer(80 << 20)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name  string
		layer v1.Layer
	}{{"unpack", zeros}, {"fetch", random}} {
		t.Run(tc.name, func(t *testing.T) {
			v := cu129
			v.Layers = []v1.Layer{tc.layer}
			publish(t, reg, "demo", v)
			// A driver change makes the pin stale, so the new build is pulled.
			nodes.Set(h100("580.95.0" + string(rune('1'+i))))
			st := p.Provision(ctx, provision.Want{Ref: ref})
			if st.State != provision.Failed || !strings.Contains(st.Detail, "no space left on device") ||
				!strings.Contains(st.Detail, "failed at pull") || !strings.Contains(st.Detail, "is unchanged") {
				t.Fatalf("state %s: %s; want failed at pull, no space left, the pin unchanged", st.State, st.Detail)
			}
			t.Logf("failed as: %s", st.Detail)
			samePins(t, rt, before)
			if recs := gpupinRecords(t, rt); len(recs) != 1 || recs[0] != before[0].Ref {
				t.Errorf("records under gpupin labels: %v", recs)
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
	// The pinned image still runs: the full disk took nothing it needs.
	res, err := rt.Run(ctx, containerd.RunSpec{Image: before[0].Ref, Args: []string{"/bin/sh", "-c", "echo alive"}, Role: "replica"})
	if err != nil || !bytes.Contains(res.Output, []byte("alive")) {
		t.Fatalf("the pinned image does not run after the disk filled: %v %q", err, res.Output)
	}
}
