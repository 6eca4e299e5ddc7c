package runtime

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// owner identifies this process across pid reuse: pid and start time.
var owner = ownerOf(os.Getpid())

func ownerOf(pid int) string {
	return fmt.Sprintf("%d:%s", pid, startTime(pid))
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

// ownerAlive reports whether the process named in an owner label still runs.
func ownerAlive(label string) bool {
	pidStr, start, ok := strings.Cut(label, ":")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return false
	}
	st := startTime(pid)
	return st != "" && st == start
}
