package runtime

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// owner identifies this process across pid reuse: pid, start time, and
// the pid namespace they are numbers in.
var owner = ownerOf(os.Getpid())

// pidNS names this process's pid namespace ("pid:[4026531836]").
var pidNS, _ = os.Readlink("/proc/self/ns/pid")

func ownerOf(pid int) string {
	return fmt.Sprintf("%d:%s:%s", pid, startTime(pid), pidNS)
}

// startTime is field 22 of /proc/PID/stat, in clock ticks since boot.
func startTime(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name may hold spaces; fields start after its ')'.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// ownerAlive reports whether the process named in an owner label still
// runs. A process of another pid namespace (the agent in a pod, an operator
// on the host) cannot be looked up from here: it counts as alive. Its
// leases expire by themselves; `gc --all` removes its records and probe
// containers once they are older than a lease (see staleForeign).
func ownerAlive(label string) bool {
	pidStr, rest, ok := strings.Cut(label, ":")
	if !ok {
		return false
	}
	start, ns, _ := strings.Cut(rest, ":")
	if ns != "" && ns != pidNS {
		return true
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return false
	}
	st := startTime(pid)
	return st != "" && st == start
}

// staleForeign reports whether an owner label names a process of another pid
// namespace and the thing it owns is older than a lease lives: whatever
// made it has had a day to finish.
func staleForeign(label string, created time.Time) bool {
	_, rest, _ := strings.Cut(label, ":")
	_, ns, _ := strings.Cut(rest, ":")
	return ns != "" && ns != pidNS && time.Since(created) > leaseTTL
}
