package runtime

import (
	"fmt"
	"os"
	"strconv"
	"strings"
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
// on the host) cannot be looked up from here: it counts as alive, and what
// it left goes when its lease expires or on `gc --all`.
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
