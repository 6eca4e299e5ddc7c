package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
)

// ProbeCgroup waits for a probe container of rt's namespace to run and
// reads its cgroup's limits from the host (CgroupLimits). It gives up
// after within, or when ended says the work that would run it is over.
func ProbeCgroup(rt *containerd.Runtime, within time.Duration, ended func() bool) ([]string, error) {
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	deadline := time.Now().Add(within)
	for {
		if ended() {
			return nil, fmt.Errorf("it ended before a probe was seen running")
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no probe ran within %s", within)
		}
		conts, _ := rt.Client().Containers(ctx, fmt.Sprintf(`labels.%q==probe`, containerd.LabelRole))
		for _, c := range conts {
			task, err := c.Task(ctx, nil)
			if err != nil {
				continue
			}
			if st, err := task.Status(ctx); err != nil || st.Status != "running" {
				continue
			}
			if l, err := CgroupLimits(task.Pid()); err == nil {
				return l, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CgroupLimits reads the memory, memory+swap and pids limits of a
// process's cgroup on the host, as "mem=…", "memsw=…", "pids=…" (cgroup
// v1) or "mem=…", "swap=…", "pids=…" (v2, swap alone).
func CgroupLimits(pid uint32) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 {
			for _, c := range strings.Split(f[1], ",") {
				paths[c] = f[2]
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
	if mem, ok := paths["memory"]; ok {
		m := filepath.Join("/sys/fs/cgroup/memory", mem)
		return []string{"mem=" + read(m+"/memory.limit_in_bytes"), "memsw=" + read(m+"/memory.memsw.limit_in_bytes"),
			"pids=" + read(filepath.Join("/sys/fs/cgroup/pids", paths["pids"], "pids.max"))}, nil
	}
	u := filepath.Join("/sys/fs/cgroup", paths[""])
	return []string{"mem=" + read(u+"/memory.max"), "swap=" + read(u+"/memory.swap.max"), "pids=" + read(u+"/pids.max")}, nil
}

// LimitLines is what CgroupLimits reads, on this node's cgroup version,
// for a memory limit with swap bounded to it and a pids limit.
func LimitLines(mem, pids int64) []string {
	m, p := strconv.FormatInt(mem, 10), strconv.FormatInt(pids, 10)
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		return []string{"mem=" + m, "memsw=" + m, "pids=" + p}
	}
	return []string{"mem=" + m, "swap=0", "pids=" + p}
}
