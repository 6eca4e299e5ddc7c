package conn

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// self is this process as LabelOwner names it, read once.
var self = OwnerOf(os.Getpid())

// Owner identifies this process across pid reuse: pid, start time, and
// the pid namespace they are numbers in. It is the LabelOwner of what this
// process makes.
func Owner() string { return self }

// pidNS names this process's pid namespace ("pid:[4026531836]").
var pidNS, _ = os.Readlink("/proc/self/ns/pid")

// OwnerOf is the owner label (io.gpupin.owner) a process of this pid
// namespace puts on what it makes: "PID:STARTTIME:PIDNS". A sweep removes
// what a label names once that process is gone. Empty fields (a process
// that is not there) make a label no live process matches.
func OwnerOf(pid int) string {
	st, _ := procStat(pid)
	return fmt.Sprintf("%d:%s:%s", pid, st.start, pidNS)
}

// procState is what the owner check needs of /proc/PID/stat.
type procState struct {
	state string // field 3: R, S, D, Z (zombie), X (dead), …
	start string // field 22: start time in clock ticks since boot
}

// procStat reads a process's state and start time.
func procStat(pid int) (procState, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procState{}, err
	}
	// The command name may hold spaces and parentheses; fields start
	// after its last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procState{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procState{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return procState{state: f[0], start: f[19]}, nil
}

// OwnerAlive reports whether the process named in an owner label still
// runs. A process of another pid namespace (the agent in a pod, an operator
// on the host) cannot be looked up from here: it counts as alive. Its
// leases expire by themselves; `gc --all` removes its records and probe
// containers once they are older than a lease (see StaleForeign).
//
// A zombie is dead: it has exited and only waits for its parent to reap
// it, which may take a while (a parent that is not an init, a supervisor
// that restarts the agent before it reaps the old one). Counting it alive
// let the probe of an agent killed and restarted within a second run on.
// The start time must match exactly, as a number: a pid reused by a
// process started at any other tick is another process.
func OwnerAlive(label string) bool {
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
	want, err := strconv.ParseUint(start, 10, 64)
	if err != nil {
		return false
	}
	st, err := procStat(pid)
	if err != nil {
		return false
	}
	got, err := strconv.ParseUint(st.start, 10, 64)
	if err != nil || got != want {
		return false
	}
	return st.state != "Z" && st.state != "X"
}

// StaleForeign reports whether an owner label names a process of another pid
// namespace and the thing it owns is older than a lease lives: whatever
// made it has had a day to finish.
func StaleForeign(label string, created time.Time) bool {
	_, rest, _ := strings.Cut(label, ":")
	_, ns, _ := strings.Cut(rest, ":")
	return ns != "" && ns != pidNS && time.Since(created) > LeaseTTL
}
