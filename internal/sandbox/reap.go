package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// A sandbox daemon's directory holds ownerLock, locked (flock) by the
// process that started the daemon for as long as that process lives: the
// kernel drops the lock when it dies, however it dies. A test binary that
// go test kills at its -timeout runs no cleanups, and its daemon's
// containers, whose init runs in a session of its own, would run on; the
// next StartContainerd finds the lock free and cleans up after it.
const ownerLock = "owner.lock"

// lockOwner takes the owner lock of a new sandbox directory. The file is
// locked before it gets its name, so no reaper ever sees it unlocked.
func lockOwner(dir string) (*os.File, error) {
	f, err := os.CreateTemp(dir, ".owner-")
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, ownerLock)); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// reapStale stops what sandbox daemons left whose owner died without
// Stop: the daemon if it outlived its owner, its shims and containers, its
// mounts and its directory. A directory with its lock held, or with no
// lock file (one being made right now, or made before there were locks),
// is left alone.
func reapStale() {
	dirs, _ := filepath.Glob("/tmp/gpupin-ctd-*")
	for _, dir := range dirs {
		f, err := os.OpenFile(filepath.Join(dir, ownerLock), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		fmt.Fprintf(os.Stderr, "sandbox: cleaning up %s, whose owner died without stopping it\n", dir)
		cfg := []byte("--config\x00" + filepath.Join(dir, "config.toml") + "\x00")
		killProcs(func(cmdline []byte) bool { return bytes.Contains(cmdline, cfg) })
		stale := &Containerd{Dir: dir, Address: filepath.Join(dir, "c.sock"),
			RuncRoot: filepath.Join(dir, "runc"), CRIRuncRoot: filepath.Join(dir, "cri-runc")}
		stale.Stop()
		f.Close()
	}
}

// killProcs sends SIGKILL to each process whose command line (NUL-separated
// arguments) matches, and to its process group.
func killProcs(match func(cmdline []byte) bool) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid <= 1 || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !match(cmdline) {
			continue
		}
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
