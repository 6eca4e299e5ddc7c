// Package sandbox starts the real parts gpupin talks to, privately: a
// containerd daemon in a temporary root and a registry on loopback. Tests,
// benchmarks and `make demo` use it; nothing in it is a mock.
package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Containerd is a private containerd daemon.
type Containerd struct {
	Dir      string // everything the daemon writes, but the shim sockets, is under here
	Address  string // its gRPC socket
	RuncRoot string // runc's state, so the host's /run/runc is untouched

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
	cfg string
}

// ContainerdOptions tunes the daemon.
type ContainerdOptions struct {
	// Root overrides where content and snapshots live (e.g. a small
	// filesystem for disk-full tests); default Dir/root.
	Root string
}

// StartContainerd starts `containerd` with a config of its own under a new
// directory in /tmp (short: unix socket paths are limited to 108 bytes).
func StartContainerd(ctx context.Context, opts ContainerdOptions) (*Containerd, error) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return nil, fmt.Errorf("containerd is not installed (apt-get install containerd runc): %w", err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("runc is not installed (apt-get install runc): %w", err)
	}
	dir, err := os.MkdirTemp("/tmp", "gpupin-ctd-")
	if err != nil {
		return nil, err
	}
	c := &Containerd{Dir: dir, Address: filepath.Join(dir, "c.sock"), RuncRoot: filepath.Join(dir, "runc")}
	root := opts.Root
	if root == "" {
		root = filepath.Join(dir, "root")
	}
	c.cfg = filepath.Join(dir, "config.toml")
	// Plugins a probe never needs are off: fewer moving parts, faster start.
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[metrics]
  address = ""
`, root, filepath.Join(dir, "state"), c.Address, c.Address+".ttrpc")
	if err := os.WriteFile(c.cfg, []byte(config), 0o644); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.RuncRoot, 0o700); err != nil {
		return nil, err
	}
	c.log, err = os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx, bin); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Containerd) start(ctx context.Context, bin string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := exec.Command(bin, "--config", c.cfg, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = c.log, c.log
	// Its own process group: a test's ^C must not reach it before cleanup does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	c.cmd = cmd
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("containerd exited at start: %s", c.LogTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if conn, err := net.Dial("unix", c.Address); err == nil {
			conn.Close()
			return nil
		}
	}
	return fmt.Errorf("containerd did not listen on %s in 20s: %s", c.Address, c.LogTail())
}

// Restart stops the daemon hard (SIGKILL, as a crash would) and starts it
// again on the same root.
func (c *Containerd) Restart(ctx context.Context) error {
	c.kill()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return err
	}
	return c.start(ctx, bin)
}

// Kill stops the daemon with SIGKILL and leaves it down.
func (c *Containerd) Kill() { c.kill() }

func (c *Containerd) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil && c.cmd.Process != nil {
		c.cmd.Process.Kill()
		c.cmd.Process.Wait()
		c.cmd = nil
	}
	os.Remove(c.Address)
}

// Stop kills the daemon and the shims and containers it started, unmounts
// what it mounted, and removes its directory.
func (c *Containerd) Stop() {
	c.kill()
	killShims(c.Address)
	unmountUnder(c.Dir)
	if err := os.RemoveAll(c.Dir); err != nil {
		// Mounts still busy: leave the directory rather than fail a cleanup.
		fmt.Fprintf(os.Stderr, "sandbox: leaving %s: %v\n", c.Dir, err)
	}
}

// LogTail returns the end of the daemon's log.
func (c *Containerd) LogTail() string {
	data, _ := os.ReadFile(filepath.Join(c.Dir, "containerd.log"))
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(bytes.TrimSpace(data))
}

// killShims ends the runc shims whose command line names our daemon's socket.
func killShims(address string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("containerd-shim")) || !bytes.Contains(cmdline, []byte(address)) {
			continue
		}
		var n int
		fmt.Sscan(pid, &n)
		// The shim's process group holds the container's init too.
		syscall.Kill(-n, syscall.SIGKILL)
		syscall.Kill(n, syscall.SIGKILL)
	}
}

func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			points = append(points, f[4])
		}
	}
	// Deepest first.
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			fmt.Fprintf(os.Stderr, "sandbox: unmount %s: %v\n", points[i], err)
		}
	}
}
