package run_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/testenv"
)

// boxScript reports, from inside the container, its seccomp mode and
// whether a user namespace (and a mount in it) can be made; then it waits
// for the test to have read its cgroup from the host (the spec mounts no
// cgroupfs inside) and to create /signal/done.
const boxScript = `grep '^Seccomp:' /proc/self/status
if /bin/busybox unshare -U -r -m /bin/busybox sh -c '/bin/busybox mount -t tmpfs t /tmp' 2>/dev/null; then echo unshare=ok; else echo unshare=refused; fi
echo ready
while [ ! -e /signal/done ]; do sleep 0.05; done`

// memLines is what testenv.CgroupLimits reads for a memory limit and a
// memory+swap limit (0: unlimited) on this node's cgroup version.
func memLines(mem, memsw int64) []string {
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		const unlimited = "9223372036854771712"
		l := []string{"mem=" + unlimited, "memsw=" + unlimited}
		if mem != 0 {
			l[0] = "mem=" + itoa(mem)
		}
		if memsw != 0 {
			l[1] = "memsw=" + itoa(memsw)
		}
		return l
	}
	l := []string{"mem=max", "swap=max"}
	if mem != 0 {
		l[0] = "mem=" + itoa(mem)
	}
	if memsw != 0 {
		l[1] = "swap=" + itoa(memsw-mem)
	}
	return l
}

// runBox runs spec with boxScript and returns what it printed and its
// cgroup's limits, read from the host while it ran.
func runBox(t *testing.T, rt *containerd.Runtime, spec containerd.RunSpec) (output string, limits []string) {
	t.Helper()
	ctx := context.Background()
	signal := t.TempDir()
	spec.ID = "box-" + strings.ToLower(strings.NewReplacer("/", "-", " ", "-", "_", "-").Replace(t.Name()))
	spec.Args, spec.Timeout = []string{"/bin/sh", "-c", boxScript}, 60*time.Second
	spec.Mounts = append(spec.Mounts, containerd.Mount{Source: signal, Destination: "/signal"})
	type result struct {
		res containerd.RunResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := rt.Run(ctx, spec)
		done <- result{res, err}
	}()
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	deadline := time.Now().Add(60 * time.Second)
	var limitsErr error
	for limits == nil {
		select {
		case r := <-done:
			t.Fatalf("the run ended before its cgroup was read: %v (exit %d)\n%s", r.err, r.res.ExitCode, r.res.Output)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never read the container's cgroup: %v", limitsErr)
		}
		if c, err := rt.Client().LoadContainer(nsctx, spec.ID); err == nil {
			if task, err := c.Task(nsctx, nil); err == nil {
				if st, err := task.Status(nsctx); err == nil && st.Status == "running" {
					limits, limitsErr = testenv.CgroupLimits(task.Pid())
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(signal, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("run: %v (exit %d)\n%s", r.err, r.res.ExitCode, r.res.Output)
	}
	return string(r.res.Output), limits
}

// missingLines lists the wanted lines missing from got.
func missingLines(got []string, want []string) []string {
	var miss []string
	for _, w := range want {
		found := false
		for _, l := range got {
			found = found || strings.TrimSpace(l) == w
		}
		if !found {
			miss = append(miss, w)
		}
	}
	return miss
}

// The box a container gets, seen from inside it and in its cgroup: the
// default seccomp profile unless it is opted out of (then a user
// namespace and a mount in it are possible, as they were for every
// replica before), and memory limits whose swap is bounded too (a probe's
// 16 GiB used to come with unlimited swap).
func TestRunBoxSeenInside(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	for _, tc := range []struct {
		name   string
		spec   containerd.RunSpec
		inside []string
		limits []string
	}{
		{"replica default", containerd.RunSpec{Role: "replica"},
			[]string{"Seccomp:\t2", "unshare=refused"}, append(memLines(0, 0), "pids=max")},
		{"replica seccomp unconfined", containerd.RunSpec{Role: "replica", Seccomp: containerd.SeccompUnconfined},
			[]string{"Seccomp:\t0", "unshare=ok"}, nil},
		{"replica limits", containerd.RunSpec{Role: "replica", MemoryLimit: 64 * mib, PidsLimit: 32},
			[]string{"Seccomp:\t2", "unshare=refused"}, append(memLines(64*mib, 64*mib), "pids=32")},
		{"replica swap allowed", containerd.RunSpec{Role: "replica", MemoryLimit: 64 * mib, MemorySwap: 96 * mib},
			nil, memLines(64*mib, 96*mib)},
		{"replica unlimited swap", containerd.RunSpec{Role: "replica", MemoryLimit: 64 * mib, MemorySwap: -1},
			nil, memLines(64*mib, 0)},
		{"probe hardened", containerd.RunSpec{Role: "probe", Hardened: true, MemoryLimit: 64 * mib, PidsLimit: 64},
			[]string{"Seccomp:\t2", "unshare=refused"}, append(memLines(64*mib, 64*mib), "pids=64")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Image = ref
			out, limits := runBox(t, rt, spec)
			if miss := missingLines(strings.Split(out, "\n"), tc.inside); len(miss) > 0 {
				t.Errorf("inside, no lines %q:\n%s", miss, out)
			}
			if miss := missingLines(limits, tc.limits); len(miss) > 0 {
				t.Errorf("in its cgroup, no %q: %q", miss, limits)
			}
		})
	}
	ctrtest.AssertNothingLeft(t, rt)
}

// Specs that cannot be honoured are refused before anything is made.
func TestRunRefusesBoxes(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec containerd.RunSpec
		want string
	}{
		{"hardened unconfined", containerd.RunSpec{Hardened: true, Seccomp: containerd.SeccompUnconfined}, "always filters"},
		{"unknown seccomp", containerd.RunSpec{Seccomp: "relaxed"}, "want default or unconfined"},
		{"swap below memory", containerd.RunSpec{MemoryLimit: 64 << 20, MemorySwap: 32 << 20}, "at least the memory limit"},
		{"swap without memory", containerd.RunSpec{MemorySwap: 32 << 20}, "at least the memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			spec.Image, spec.Args, spec.Role = ref, []string{"true"}, "replica"
			if _, err := rt.Run(ctx, spec); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one about %q", err, tc.want)
			}
		})
	}
	ctrtest.AssertNothingLeft(t, rt)
}

// Where nvidia-container-runtime is not installed, the nvidia-runtime mode
// fails with a message that names it, and leaves nothing behind.
func TestNvidiaRuntimeModeMissingBinary(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	ref := ctrtest.Pushed(t, reg)
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", Args: []string{"true"}, Timeout: 30 * time.Second,
		GPUs: containerd.GPUs{Mode: containerd.GPUNvidiaRuntime}})
	if err == nil || !strings.Contains(err.Error(), "nvidia-container-runtime") {
		t.Fatalf("err = %v, want one naming nvidia-container-runtime", err)
	}
	ctrtest.AssertNothingLeft(t, rt)
}
