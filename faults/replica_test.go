package faults

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// replicaScript reports, from inside the replica, its seccomp mode and
// whether a user namespace with a mount in it can be made (what a replica
// could do before: a full capability set in the new namespace, and
// mount); then it waits until the test has read its cgroup from the host
// and created /tmp/done by an exec.
const replicaScript = `grep '^Seccomp:' /proc/self/status
if /bin/busybox unshare -U -r -m /bin/busybox sh -c '/bin/busybox mount -t tmpfs t /tmp' 2>/dev/null; then echo unshare=ok; else echo unshare=refused; fi
while [ ! -e /tmp/done ]; do sleep 0.05; done`

// A replica from `gpupin run` gets containerd's default seccomp profile
// unless --seccomp unconfined says otherwise, and --memory (with no swap
// beyond it) and --pids limits in its cgroup. Bad values are usage errors.
func TestFaultReplicaBoxSimulated(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	d := testenv.Containerd(t)
	mustReady(t, newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 0).Provision(ctx, provision.Want{Ref: publish(t, reg, "demo", cu129)}))
	bin := buildGpupin(t)
	nodeFile := filepath.Join(t.TempDir(), "node.json")
	os.WriteFile(nodeFile, []byte(nodeJSON), 0o644)
	gpupin := func(name string, flags ...string) *exec.Cmd {
		args := []string{"--address", d.Address, "--namespace", rt.Namespace(), "--node", nodeFile,
			"run", "--runc-root", d.RuncRoot, "--name", name}
		args = append(append(args, flags...), "demo:1.0", "--", "/bin/sh", "-c", replicaScript)
		return exec.Command(bin, args...)
	}
	const mib = 1 << 20
	unlimited := "9223372036854771712" // cgroup v1's "no limit", page-aligned
	for _, tc := range []struct {
		name   string
		flags  []string
		inside []string
		limits []string // mem=, memsw=, pids= in the replica's cgroup (v1)
		stderr string
	}{
		{"default", nil, []string{"Seccomp:\t2", "unshare=refused"}, []string{"mem=" + unlimited, "memsw=" + unlimited, "pids=max"}, ""},
		{"seccomp-unconfined", []string{"--seccomp", "unconfined"}, []string{"Seccomp:\t0", "unshare=ok"}, nil, "not filtered"},
		{"memory-and-pids", []string{"--memory", "64m", "--pids", "32"}, []string{"Seccomp:\t2"},
			[]string{fmt.Sprintf("mem=%d", 64*mib), fmt.Sprintf("memsw=%d", 64*mib), "pids=32"}, ""},
		{"memory-binary-unit", []string{"--memory=1.5GiB"}, nil, []string{fmt.Sprintf("mem=%d", 1536*mib), fmt.Sprintf("memsw=%d", 1536*mib)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.limits
			if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
				want = cgroupV2Limits(tc.limits, unlimited)
			}
			name := "replica-" + tc.name
			cmd := gpupin(name, tc.flags...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			var limits []string
			waitFor(t, "the replica runs", func() bool {
				select {
				case err := <-exited:
					t.Fatalf("gpupin run ended early: %v\n%s%s", err, stdout.String(), stderr.String())
				default:
				}
				limits = replicaLimits(t, rt, name)
				return limits != nil
			})
			finishReplica(t, rt, name)
			if err := <-exited; err != nil {
				t.Fatalf("gpupin run: %v\n%s%s", err, stdout.String(), stderr.String())
			}
			for _, w := range tc.inside {
				if !strings.Contains(stdout.String(), w+"\n") {
					t.Errorf("inside the replica, no %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range want {
				if !slices.Contains(limits, w) {
					t.Errorf("in the replica's cgroup, no %q: %q", w, limits)
				}
			}
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderr, stderr.String())
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}

	for _, flags := range [][]string{{"--seccomp", "relaxed"}, {"--memory", "lots"}, {"--memory", "0"}, {"--pids", "-1"}} {
		out, err := gpupin("refused", flags...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("gpupin run %v: %v, want exit 2 (usage)\n%s", flags, err, out)
		}
	}
	if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// replicaLimits reads the limits of a running replica's cgroup from the
// host (no cgroupfs is mounted inside); nil until its task runs.
func replicaLimits(t *testing.T, rt *containerd.Runtime, id string) []string {
	t.Helper()
	ctx := testenv.Context(rt)
	c, err := rt.Client().LoadContainer(ctx, id)
	if err != nil {
		return nil
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil
	}
	if st, err := task.Status(ctx); err != nil || st.Status != "running" {
		return nil
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", task.Pid()))
	if err != nil {
		return nil
	}
	paths := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 {
			for _, ctl := range strings.Split(f[1], ",") {
				paths[ctl] = f[2]
			}
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			return "(" + err.Error() + ")"
		}
		return strings.TrimSpace(string(b))
	}
	mem := filepath.Join("/sys/fs/cgroup/memory", paths["memory"])
	return []string{"mem=" + read(mem+"/memory.limit_in_bytes"), "memsw=" + read(mem+"/memory.memsw.limit_in_bytes"),
		"pids=" + read(filepath.Join("/sys/fs/cgroup/pids", paths["pids"], "pids.max"))}
}

// finishReplica lets replicaScript end: it creates /tmp/done inside by an
// exec, with the replica's own process spec.
func finishReplica(t *testing.T, rt *containerd.Runtime, id string) {
	t.Helper()
	ctx := testenv.Context(rt)
	c, err := rt.Client().LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps := *spec.Process
	ps.Args = []string{"/bin/touch", "/tmp/done"}
	p, err := task.Exec(ctx, "done", &ps, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Delete(ctx)
	ch, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-ch; st.ExitCode() != 0 {
		t.Fatalf("touch /tmp/done in the replica: exit %d", st.ExitCode())
	}
}

// cgroupV2Limits says v1's expected limits as cgroup v2 files hold them:
// "max" for no limit, and swap beside memory rather than memory+swap.
func cgroupV2Limits(v1 []string, unlimited string) []string {
	var mem string
	for _, l := range v1 {
		if v, ok := strings.CutPrefix(l, "mem="); ok {
			mem = v
		}
	}
	var out []string
	for _, l := range v1 {
		k, v, _ := strings.Cut(l, "=")
		if v == unlimited {
			v = "max"
		}
		switch {
		case k == "memsw" && v == "max":
			out = append(out, "swap=max")
		case k == "memsw" && v == mem:
			out = append(out, "swap=0")
		case k == "memsw":
			continue // no such case among the tests
		default:
			out = append(out, k+"="+v)
		}
	}
	return out
}
