package conn

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestOwnerLabels(t *testing.T) {
	self := OwnerOf(os.Getpid())
	foreign := "1:12345:pid:[1]"
	pid, start, _ := strings.Cut(self, ":")
	start, _, _ = strings.Cut(start, ":")
	for _, tc := range []struct {
		label string
		alive bool
	}{
		{self, true},
		{"", false},
		{"garbage", false},
		{"999999999:1", false},                        // the old pid:start form, of no process
		{"1:0", false},                                // pid 1 exists, but started at another time
		{foreign, true},                               // another pid namespace: cannot be seen, so alive
		{"999999999:1:" + pidNS, false},               // this namespace, gone
		{pid + "::" + pidNS, false},                   // no start time: matches no process
		{pid + ":" + start + "1:" + pidNS, false},     // this pid, started at another tick
		{pid + ":" + start + ".0:" + pidNS, false},    // not a tick count
		{pid + ":" + start + ":" + pidNS + "x", true}, // another namespace's name: cannot be seen
	} {
		if got := OwnerAlive(tc.label); got != tc.alive {
			t.Errorf("OwnerAlive(%q) = %v, want %v", tc.label, got, tc.alive)
		}
	}
	if StaleForeign(foreign, time.Now()) || !StaleForeign(foreign, time.Now().Add(-25*time.Hour)) || StaleForeign(self, time.Now().Add(-48*time.Hour)) {
		t.Error("StaleForeign: only another namespace's leftovers older than a lease are stale")
	}
}

// A process that was killed but not yet reaped is a zombie: its
// /proc/PID/stat is still there with its start time, and it owns nothing.
func TestOwnerZombieIsDead(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	label := OwnerOf(cmd.Process.Pid)
	if !OwnerAlive(label) {
		t.Fatalf("OwnerAlive(%q) = false for a running process", label)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped: wait for the kernel to make it a zombie.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := procStat(cmd.Process.Pid)
		if err != nil {
			t.Fatalf("a killed, unreaped process vanished: %v", err)
		}
		if st.state == "Z" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %s, never a zombie", st.state)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if OwnerAlive(label) {
		t.Errorf("OwnerAlive(%q) = true for a zombie", label)
	}
}
