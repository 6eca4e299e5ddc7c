package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// NodeNS is a simulated node's own view of the host paths a node's daemons
// and agent share by name (/var/lib/gpupin, /run/containerd, the NFD
// feature directory, …): a mount namespace in which each such path is a
// bind mount of a directory of this node's. Several simulated nodes on one
// machine then keep the paths a real node has, each its own, and a chart's
// hostPath defaults mean on each what they mean on a real node. Processes
// started through Enter see the node's paths; everything else on the host
// is shared, /tmp included.
type NodeNS struct {
	Dir  string            // the node's directories, one per bound path
	Bind map[string]string // in-namespace path -> its directory under Dir

	holder *exec.Cmd
	done   chan struct{}
}

// StartNodeNS makes a mount namespace in which each of paths (absolute
// directories) is a private directory under dir. The paths are created on
// the host, empty, where they are missing: a bind mount needs its target.
func StartNodeNS(dir string, paths ...string) (*NodeNS, error) {
	n := &NodeNS{Dir: dir, Bind: map[string]string{}}
	sorted := slices.Clone(paths)
	sort.Strings(sorted) // a parent before what is below it
	var script strings.Builder
	script.WriteString("set -e\n")
	for i, p := range sorted {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("nodens: %q is not an absolute path", p)
		}
		src := filepath.Join(dir, strconv.Itoa(i)+strings.ReplaceAll(p, "/", "_"))
		for _, d := range []string{src, p} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, fmt.Errorf("nodens: %w", err)
			}
		}
		n.Bind[p] = src
		fmt.Fprintf(&script, "mount --bind %s %s\n", strconv.Quote(src), strconv.Quote(p))
	}
	script.WriteString("echo ready\nexec sleep infinity\n")
	// Private propagation: the node's mounts (its containers' rootfs) stay
	// in it, and go with it when its last process exits.
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("nodens: unshare: %w", err)
	}
	n.holder, n.done = cmd, make(chan struct{})
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
		cmd.Wait()
		close(n.done)
	}()
	select {
	case ok := <-ready:
		if !ok {
			n.Stop()
			return nil, fmt.Errorf("nodens: the namespace's mounts failed (see the log above)")
		}
	case <-time.After(10 * time.Second):
		n.Stop()
		return nil, fmt.Errorf("nodens: the namespace was not ready in 10s")
	}
	return n, nil
}

// Enter is the command prefix that runs a program in the namespace
// (nsenter execs it: the program keeps its own PID).
func (n *NodeNS) Enter() []string {
	return []string{"nsenter", "--target", strconv.Itoa(n.holder.Process.Pid), "--mount", "--"}
}

// Path is where the node's path p lies on the host (p itself when p is
// not one of the bound paths or below one).
func (n *NodeNS) Path(p string) string {
	best := ""
	for in := range n.Bind {
		if (p == in || strings.HasPrefix(p, in+"/")) && len(in) > len(best) {
			best = in
		}
	}
	if best == "" {
		return p
	}
	return filepath.Join(n.Bind[best], strings.TrimPrefix(p, best))
}

// Stop ends the holder; the namespace, and its mounts, go once the
// processes entered into it have exited too (stop them first).
func (n *NodeNS) Stop() {
	if n.holder == nil || n.holder.Process == nil {
		return
	}
	n.holder.Process.Kill()
	<-n.done
	n.holder = nil
}

// BindMount binds src at target in the namespace, after it started: for
// a directory known only later (a daemon's own).
func (n *NodeNS) BindMount(src, target string) error {
	enter := n.Enter()
	args := append(enter[1:len(enter):len(enter)], "mount", "--bind", src, target)
	if out, err := exec.Command(enter[0], args...).CombinedOutput(); err != nil {
		return fmt.Errorf("nodens: bind %s at %s: %w: %s", src, target, err, strings.TrimSpace(string(out)))
	}
	return nil
}
