// Package faults holds gpupin's fault suite: bad days (a registry that dies
// or lies, a containerd restart, gpupin killed, a full disk) played against
// the real containerd and a real registry, each asserting that no working
// pin is lost and nothing is left behind. docs/faults.md describes them.
package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var cu129 = testenv.CU129

const nodeJSON = `{"driver":"580.82.07","cuda":"13.0","platform":"linux/amd64","gpus":[{"index":0,"uuid":"GPU-11111111-2222-3333-4444-555555555555","name":"NVIDIA H100 80GB HBM3","brand":"nvidia","cc":"9.0","memory_mib":81559}]}`

// h100 is the simulated node on a CUDA 13.0 driver; a new driver version
// makes a pin stale, so the next provision pulls.
func h100(driver string) *node.Facts { return testenv.H100(driver, "13.0") }

func newProvisioner(t *testing.T, rt *containerd.Runtime, nodes node.Reader, timeout time.Duration) *provision.Provisioner {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return testenv.Provisioner(t, rt, provision.WithNode(nodes), provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(t.TempDir()), provision.WithProbeTimeout(timeout), provision.WithProbeDir(t.TempDir()))
}

func publish(t *testing.T, reg *sandbox.Registry, engine string, v sandbox.EngineVariant) string {
	t.Helper()
	return sandbox.MustPublishEngineAs(t, reg.Host+"/"+engine, engine, "1.0", v)
}

func mustReady(t *testing.T, st provision.Status) {
	t.Helper()
	if st.State != provision.Ready {
		t.Fatalf("state %s, want ready: %s", st.State, st.Detail)
	}
}

func pins(t *testing.T, rt *containerd.Runtime) []containerd.Pin {
	t.Helper()
	ps, err := rt.Pins(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// samePins fails unless the pins are exactly the ones before: same records,
// same probe times, same node.
func samePins(t *testing.T, rt *containerd.Runtime, before []containerd.Pin) {
	t.Helper()
	after := pins(t, rt)
	if len(after) != len(before) {
		t.Fatalf("pins changed: before %+v, after %+v", before, after)
	}
	for i := range before {
		b, a := before[i], after[i]
		if a.Key != b.Key || a.Ref != b.Ref || !a.ProbedAt.Equal(b.ProbedAt) || a.Node != b.Node || a.Probe != b.Probe {
			t.Fatalf("pin %s changed:\nbefore %+v\nafter  %+v", b.Key, b, a)
		}
	}
}

// gpupinRecords lists image records that carry any io.gpupin label.
func gpupinRecords(t *testing.T, rt *containerd.Runtime) []string {
	t.Helper()
	imgs, err := rt.Client().ImageService().List(testenv.Context(rt))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, img := range imgs {
		if img.Labels[containerd.LabelLocal] != "" {
			continue // a pin's node-local name: part of the pin, not a record of its own
		}
		for k := range img.Labels {
			if strings.HasPrefix(k, "io.gpupin.") {
				out = append(out, img.Name)
				break
			}
		}
	}
	return out
}

// leftovers lists what a finished or swept gpupin must not leave:
// containers, tasks, active snapshots, leases, unpinned gpupin records.
func leftovers(t *testing.T, rt *containerd.Runtime, snapshotter string) []string {
	t.Helper()
	ctx := testenv.Context(rt)
	cl := rt.Client()
	var out []string
	conts, err := cl.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conts {
		out = append(out, "container "+c.ID())
	}
	tasks, err := cl.TaskService().List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks.Tasks {
		out = append(out, "task "+tk.ID)
	}
	err = cl.SnapshotService(snapshotter).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind == snapshots.KindActive {
			out = append(out, "active snapshot "+i.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := cl.ImageService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A pin's lease and its node-local name belong to the pin.
	pinned := map[string]string{} // key -> digest
	for _, img := range imgs {
		if k := img.Labels[containerd.LabelPin]; k != "" {
			pinned[k] = img.Target.Digest.String()
		}
	}
	ls, err := cl.LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Labels[containerd.LabelRole] == containerd.PinLeaseRole && pinned[l.Labels[containerd.LabelPin]] != "" {
			continue
		}
		out = append(out, fmt.Sprintf("lease %s %v", l.ID, l.Labels))
	}
	for _, img := range imgs {
		if k := img.Labels[containerd.LabelLocal]; k != "" && pinned[k] == img.Target.Digest.String() {
			continue
		}
		if img.Labels[containerd.LabelManaged] != "" && img.Labels[containerd.LabelPin] == "" && img.Labels[containerd.LabelPrevious] == "" {
			out = append(out, fmt.Sprintf("unpinned record %s %v", img.Name, img.Labels))
		}
	}
	return out
}

// waitFor polls cond until it holds; the limit only stops a broken test
// from hanging, it asserts nothing about speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probeRunning reports whether a probe container of the namespace has a
// running task.
func probeRunning(rt *containerd.Runtime) bool {
	ctx := testenv.Context(rt)
	conts, err := rt.Client().Containers(ctx, fmt.Sprintf(`labels.%q==probe`, containerd.LabelRole))
	if err != nil {
		return false
	}
	for _, c := range conts {
		if task, err := c.Task(ctx, nil); err == nil {
			if st, err := task.Status(ctx); err == nil && st.Status == "running" {
				return true
			}
		}
	}
	return false
}

// probePids counts the processes of the namespace's probe tasks.
func probePids(rt *containerd.Runtime) int {
	ctx := testenv.Context(rt)
	conts, err := rt.Client().Containers(ctx, fmt.Sprintf(`labels.%q==probe`, containerd.LabelRole))
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range conts {
		if task, err := c.Task(ctx, nil); err == nil {
			if ps, err := task.Pids(ctx); err == nil {
				n += len(ps)
			}
		}
	}
	return n
}

// buildGpupin builds cmd/gpupin into the test's temporary directory.
func buildGpupin(t *testing.T) string {
	t.Helper()
	testenv.Daemons(t)
	bin := filepath.Join(t.TempDir(), "gpupin")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/gpupin/gpupin/cmd/gpupin")
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build gpupin: %v\n%s", err, out)
	}
	return bin
}
