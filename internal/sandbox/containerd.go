// Package sandbox starts the real parts gpupin talks to, privately: a
// containerd daemon in a temporary root and a registry on loopback. Tests,
// benchmarks and `make demo` use it; nothing in it is a mock.
package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvContainerd names the containerd to start instead of the one on PATH:
// a directory holding containerd, containerd-shim-runc-v2 and ctr (as
// `GOBIN=DIR go install github.com/containerd/containerd/v2/cmd/...@v2.4.2`
// makes them), or the path of a containerd binary with its shim beside it.
// `make test` runs the suite once without it (Debian's 1.6) and once with
// it set to containerd 2.4.2.
const EnvContainerd = "GPUPIN_TEST_CONTAINERD"

// DefaultSandboxImage is the CRI plugin's pause image unless
// ContainerdOptions.SandboxImage says otherwise: a name no registry serves
// (nothing can be pulled from outside), so a test that runs pod sandboxes
// puts an image of its own under it first.
const DefaultSandboxImage = "gpupin.invalid/pause:test"

// Containerd is a private containerd daemon.
type Containerd struct {
	Dir      string // everything the daemon writes, but the shim sockets, is under here
	Address  string // its gRPC socket; with CRI on, the CRI endpoint too
	RuncRoot string // runc's state, so the host's /run/runc is untouched

	// Bin is the daemon's binary; BinDir, when not "", is put first in
	// the daemon's PATH so it starts the shim built with it.
	Bin    string
	BinDir string
	// Version is what `containerd --version` reports ("1.6.20~ds1",
	// "2.4.2+unknown"); Major is its first number, for tests whose
	// expectations differ between 1.x and 2.x.
	Version string
	Major   int

	// CRI says the CRI plugin is on (ContainerdOptions.CRI), with
	// SandboxImage as its pause image and CRIRuncRoot as the runc root of
	// the pods' containers.
	CRI          bool
	SandboxImage string
	CRIRuncRoot  string

	mu    sync.Mutex
	cmd   *exec.Cmd
	log   *os.File
	cfg   string
	owner *os.File // the owner lock (reap.go), held until Stop
	wrap  []string // ContainerdOptions.Wrap
}

// ContainerdOptions tunes the daemon.
type ContainerdOptions struct {
	// Root overrides where content and snapshots live (e.g. a small
	// filesystem for disk-full tests); default Dir/root.
	Root string
	// Bin is the containerd to run, as EnvContainerd takes it (a directory
	// or a binary); default $GPUPIN_TEST_CONTAINERD, else containerd from
	// PATH.
	Bin string
	// CRI turns on containerd's CRI plugin (off otherwise: a probe never
	// needs it, and it starts slower), serving on Address, with no CNI
	// (host-network pods only), its own runc root, and its state under
	// the daemon's root and state.
	CRI bool
	// SandboxImage is the CRI plugin's pause image; default
	// DefaultSandboxImage.
	SandboxImage string
	// RegistryConfigPath is a certs.d directory (hosts.toml per registry)
	// for the CRI plugin's pulls; default none.
	RegistryConfigPath string
	// CNILoopback puts a loopback-only network in the CRI plugin's CNI
	// directory: the runtime then reports its network ready, as a node
	// with a CNI does, so a kubelet registered with an API server makes a
	// Ready Node. Pods still run on the host's network only.
	CNILoopback bool
	// Wrap is put before the daemon's command line (and runc's, at Stop):
	// e.g. NodeNS.Enter(), to run it in a simulated node's mount namespace.
	Wrap []string
}

// StartContainerd starts `containerd` with a config of its own under a new
// directory in /tmp (short: unix socket paths are limited to 108 bytes).
// The config is version 2 for containerd 1.x and version 3 for 2.x, where
// the CRI plugin was split into plugins of other names.
func StartContainerd(ctx context.Context, opts ContainerdOptions) (*Containerd, error) {
	bin, binDir, err := findContainerd(opts.Bin)
	if err != nil {
		return nil, err
	}
	if _, err := lookPathIn(binDir, "runc"); err != nil {
		return nil, fmt.Errorf("runc is not installed (apt-get install runc): %w", err)
	}
	version, major, err := containerdVersion(bin)
	if err != nil {
		return nil, err
	}
	// What a daemon whose owner was killed left behind goes first.
	reapStale()
	dir, err := os.MkdirTemp("/tmp", "gpupin-ctd-")
	if err != nil {
		return nil, err
	}
	c := &Containerd{
		Dir: dir, Address: filepath.Join(dir, "c.sock"), RuncRoot: filepath.Join(dir, "runc"),
		Bin: bin, BinDir: binDir, Version: version, Major: major,
		CRI: opts.CRI, SandboxImage: cmp.Or(opts.SandboxImage, DefaultSandboxImage),
		wrap: slices.Clone(opts.Wrap),
	}
	fail := func(err error) (*Containerd, error) {
		c.Stop()
		return nil, err
	}
	if c.owner, err = lockOwner(dir); err != nil {
		return fail(err)
	}
	if c.CRI {
		c.CRIRuncRoot = filepath.Join(dir, "cri-runc")
	}
	root := cmp.Or(opts.Root, filepath.Join(dir, "root"))
	c.cfg = filepath.Join(dir, "config.toml")
	config := c.config(root, filepath.Join(dir, "state"), opts.RegistryConfigPath)
	if err := os.WriteFile(c.cfg, []byte(config), 0o644); err != nil {
		return fail(fmt.Errorf("write containerd config: %w", err))
	}
	mkdirs := []string{c.RuncRoot}
	if c.CRI {
		mkdirs = append(mkdirs, c.CRIRuncRoot, filepath.Join(dir, "cni", "bin"), filepath.Join(dir, "cni", "net.d"))
	}
	for _, d := range mkdirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fail(err)
		}
	}
	if c.CRI && opts.CNILoopback {
		// CRI counts a network as configured once a config loads; the
		// loopback plugin is never run for host-network pods.
		conf := `{"cniVersion": "1.0.0", "name": "gpupin-loopback", "plugins": [{"type": "loopback"}]}`
		if err := os.WriteFile(filepath.Join(dir, "cni", "net.d", "10-loopback.conflist"), []byte(conf), 0o644); err != nil {
			return fail(err)
		}
	}
	if c.log, err = os.Create(filepath.Join(dir, "containerd.log")); err != nil {
		return fail(err)
	}
	if err := c.start(ctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// findContainerd resolves which daemon to run: opt, else $GPUPIN_TEST_CONTAINERD,
// else PATH. A named one must have its shim beside it: a 2.x daemon would
// otherwise start Debian's 1.6 shim from PATH, and the run would test a mix.
func findContainerd(opt string) (bin, binDir string, err error) {
	name, from := opt, "ContainerdOptions.Bin"
	if name == "" {
		name, from = os.Getenv(EnvContainerd), EnvContainerd
	}
	if name == "" {
		bin, err := exec.LookPath("containerd")
		if err != nil {
			return "", "", fmt.Errorf("containerd is not installed (apt-get install containerd runc, or set %s to a containerd 2.x directory): %w", EnvContainerd, err)
		}
		return bin, "", nil
	}
	st, err := os.Stat(name)
	if err != nil {
		return "", "", fmt.Errorf("%s=%s: %w", from, name, err)
	}
	bin, binDir = name, filepath.Dir(name)
	if st.IsDir() {
		bin, binDir = filepath.Join(name, "containerd"), name
	}
	if binDir, err = filepath.Abs(binDir); err != nil {
		return "", "", err
	}
	for _, p := range []string{bin, filepath.Join(binDir, "containerd-shim-runc-v2")} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%s=%s: no executable %s (build it: scripts/deps.sh)", from, name, p)
		}
	}
	return filepath.Join(binDir, filepath.Base(bin)), binDir, nil
}

// lookPathIn finds a program in dir, then on PATH: what the daemon, whose
// PATH starts with dir, will find.
func lookPathIn(dir, prog string) (string, error) {
	if dir != "" {
		p := filepath.Join(dir, prog)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(prog)
}

// containerdVersion asks the binary: `containerd --version` prints
// "containerd github.com/containerd/containerd[/v2] VERSION REVISION".
func containerdVersion(bin string) (string, int, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", 0, fmt.Errorf("%s --version: %w", bin, err)
	}
	f := strings.Fields(string(out))
	if len(f) < 3 {
		return "", 0, fmt.Errorf("%s --version: unexpected output %q", bin, out)
	}
	version := strings.TrimPrefix(f[2], "v")
	major, err := strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	if err != nil {
		return "", 0, fmt.Errorf("%s --version: no major version in %q", bin, version)
	}
	return version, major, nil
}

// Plugins a probe never needs are off: fewer moving parts, faster start,
// and nothing that reads or writes host paths outside Dir. Names that a
// version lacks are ignored by it.
var disabledPlugins = []string{
	"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
	"io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
	"io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
}

// In 2.x, besides: NRI (on by default, listening on the host-wide
// /var/run/nri/nri.sock that parallel daemons would fight over), and the
// erofs and blockfile snapshotters. The image verifiers stay, reading an
// empty directory of the daemon's own (config): 2.0 and 2.1's transfer
// service fails to start without one, and ctr pulls through it.
var disabledPlugins2 = []string{
	"io.containerd.nri.v1.nri",
	"io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
	"io.containerd.snapshotter.v1.blockfile",
}

// The CRI plugin's names: one plugin in 1.x; in 2.x the gRPC service, its
// image and runtime services, and the pod sandbox controller that needs them.
var (
	criPlugins1 = []string{"io.containerd.grpc.v1.cri"}
	criPlugins2 = []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images",
		"io.containerd.cri.v1.runtime", "io.containerd.podsandbox.controller.v1.podsandbox"}
)

// config is the text of the daemon's config.toml: version 2 for 1.x, version 3
// for 2.x. (2.3 and later read version 4 natively; version 3 is what every
// 2.x reads, and migrating it takes microseconds at start.)
func (c *Containerd) config(root, state, registryConfigPath string) string {
	disabled := slices.Clone(disabledPlugins)
	if c.Major >= 2 {
		disabled = append(disabled, disabledPlugins2...)
	}
	if !c.CRI {
		disabled = append(disabled, c.criPlugins()...)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "version = %d\nroot = %s\nstate = %s\ndisabled_plugins = [%s]\n", c.configVersion(), q(root), q(state), list(disabled))
	fmt.Fprintf(&b, "[grpc]\n  address = %s\n[ttrpc]\n  address = %s\n[metrics]\n  address = \"\"\n", q(c.Address), q(c.Address+".ttrpc"))
	// The opt plugin installs into /opt/containerd by default.
	fmt.Fprintf(&b, "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = %s\n", q(filepath.Join(c.Dir, "opt")))
	if c.Major >= 2 {
		fmt.Fprintf(&b, "[plugins.\"io.containerd.image-verifier.v1.bindir\"]\n  bin_dir = %s\n", q(filepath.Join(c.Dir, "image-verifier")))
	}
	if !c.CRI {
		return b.String()
	}
	cniBin, cniConf := filepath.Join(c.Dir, "cni", "bin"), filepath.Join(c.Dir, "cni", "net.d")
	// Both: pods' network namespaces under the state directory rather than
	// /var/run/netns, the streaming server on a free loopback port, empty
	// CNI directories of the daemon's own (a host's CNI config must not
	// count), and runc state under CRIRuncRoot. restrict_oom_score_adj
	// keeps a pod's OOM score no lower than the daemon's: the CRI plugin
	// gives pause containers -998, and where lowering it is refused (these
	// VMs refuse any negative value, "I/O error") runc fails at create with
	// "can't get final child's PID from pipe: EOF".
	if c.Major < 2 {
		cri := `plugins."io.containerd.grpc.v1.cri"`
		fmt.Fprintf(&b, "[%s]\n  sandbox_image = %s\n  netns_mounts_under_state_dir = true\n  restrict_oom_score_adj = true\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n", cri, q(c.SandboxImage))
		fmt.Fprintf(&b, "[%s.cni]\n  bin_dir = %s\n  conf_dir = %s\n", cri, q(cniBin), q(cniConf))
		fmt.Fprintf(&b, "[%s.containerd]\n  snapshotter = \"overlayfs\"\n  default_runtime_name = \"runc\"\n", cri)
		fmt.Fprintf(&b, "[%s.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n", cri)
		fmt.Fprintf(&b, "[%s.containerd.runtimes.runc.options]\n  Root = %s\n", cri, q(c.CRIRuncRoot))
		fmt.Fprintf(&b, "[%s.registry]\n  config_path = %s\n", cri, q(registryConfigPath))
		return b.String()
	}
	images, rt := `plugins."io.containerd.cri.v1.images"`, `plugins."io.containerd.cri.v1.runtime"`
	fmt.Fprintf(&b, "[%s]\n  snapshotter = \"overlayfs\"\n", images)
	fmt.Fprintf(&b, "[%s.pinned_images]\n  sandbox = %s\n", images, q(c.SandboxImage))
	fmt.Fprintf(&b, "[%s.registry]\n  config_path = %s\n", images, q(registryConfigPath))
	fmt.Fprintf(&b, "[%s]\n  netns_mounts_under_state_dir = true\n  restrict_oom_score_adj = true\n", rt)
	fmt.Fprintf(&b, "[%s.cni]\n  bin_dirs = [%s]\n  conf_dir = %s\n", rt, q(cniBin), q(cniConf))
	fmt.Fprintf(&b, "[%s.containerd]\n  default_runtime_name = \"runc\"\n", rt)
	fmt.Fprintf(&b, "[%s.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n", rt)
	fmt.Fprintf(&b, "[%s.containerd.runtimes.runc.options]\n  Root = %s\n", rt, q(c.CRIRuncRoot))
	fmt.Fprintf(&b, "[plugins.\"io.containerd.grpc.v1.cri\"]\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n")
	return b.String()
}

func (c *Containerd) configVersion() int {
	if c.Major >= 2 {
		return 3
	}
	return 2
}

func (c *Containerd) criPlugins() []string {
	if c.Major >= 2 {
		return criPlugins2
	}
	return criPlugins1
}

// q quotes a TOML basic string (Go's quoting agrees for the paths and
// names written here).
func q(s string) string { return strconv.Quote(s) }

func list(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = q(s)
	}
	return strings.Join(quoted, ", ")
}

// Ctr is the ctr of the daemon's own version when one is beside it, else
// ctr from PATH.
func (c *Containerd) Ctr() string {
	if p, err := lookPathIn(c.BinDir, "ctr"); err == nil {
		return p
	}
	return "ctr"
}

// CRIEndpoint is the endpoint crictl takes (--runtime-endpoint and
// --image-endpoint): the daemon's own socket.
func (c *Containerd) CRIEndpoint() string { return "unix://" + c.Address }

func (c *Containerd) start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := c.command(c.Bin, "--config", c.cfg, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if c.BinDir != "" {
		// The daemon looks its shim up on PATH.
		cmd.Env = append(os.Environ(), "PATH="+c.BinDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	// Its own process group: a test's ^C must not reach it before cleanup does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start containerd %s: %w", c.Bin, err)
	}
	c.cmd = cmd
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("containerd %s exited at start: %s", c.Version, c.LogTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if conn, err := net.Dial("unix", c.Address); err == nil {
			conn.Close()
			return nil
		}
	}
	return fmt.Errorf("containerd %s did not listen on %s in 20s: %s", c.Version, c.Address, c.LogTail())
}

// command is bin with args, behind the wrap when there is one.
func (c *Containerd) command(bin string, args ...string) *exec.Cmd {
	if len(c.wrap) == 0 {
		return exec.Command(bin, args...)
	}
	return exec.Command(c.wrap[0], append(append(slices.Clone(c.wrap[1:]), bin), args...)...)
}

// Restart stops the daemon hard (SIGKILL, as a crash would) and starts it
// again on the same root.
func (c *Containerd) Restart(ctx context.Context) error {
	c.kill()
	return c.start(ctx)
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

// Freeze stops the daemon with SIGSTOP, as a daemon that hangs: its
// socket stays, calls to it block. Thaw lets it go on.
func (c *Containerd) Freeze() error { return c.signal(syscall.SIGSTOP) }

// Thaw lets a frozen daemon go on (SIGCONT); on a running one it does
// nothing, so a test's cleanup may call it either way.
func (c *Containerd) Thaw() error { return c.signal(syscall.SIGCONT) }

func (c *Containerd) signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return fmt.Errorf("containerd in %s is not running", c.Dir)
	}
	if len(c.wrap) > 0 {
		// The process is the wrapper's, not the daemon's.
		return fmt.Errorf("containerd in %s runs under %v: signal %v would reach the wrapper", c.Dir, c.wrap, sig)
	}
	return c.cmd.Process.Signal(sig)
}

// Stop kills the daemon and the shims and containers it started, unmounts
// what it mounted, and removes its directory.
func (c *Containerd) Stop() {
	c.kill()
	killShims(c.Address)
	c.deleteContainers()
	UnmountUnder(c.Dir)
	if err := os.RemoveAll(c.Dir); err != nil {
		// Mounts still busy: leave the directory rather than fail a cleanup.
		fmt.Fprintf(os.Stderr, "sandbox: leaving %s: %v\n", c.Dir, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range []**os.File{&c.log, &c.owner} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
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

// deleteContainers force-deletes, with runc, every container still in the
// daemon's runc roots (ROOT/NAMESPACE/ID): a container whose init runs in a
// session of its own (a CRI pod's pause, for one) is not in its shim's
// process group, and would outlive killShims, with its cgroup, when a test
// failed before removing it.
func (c *Containerd) deleteContainers() {
	runc, err := lookPathIn(c.BinDir, "runc")
	if err != nil {
		return
	}
	for _, root := range []string{c.RuncRoot, c.CRIRuncRoot} {
		if root == "" {
			continue
		}
		namespaces, _ := os.ReadDir(root)
		for _, ns := range namespaces {
			nsRoot := filepath.Join(root, ns.Name())
			ids, _ := os.ReadDir(nsRoot)
			for _, id := range ids {
				if out, err := c.command(runc, "--root", nsRoot, "delete", "--force", id.Name()).CombinedOutput(); err != nil {
					fmt.Fprintf(os.Stderr, "sandbox: runc delete %s/%s: %v: %s\n", ns.Name(), id.Name(), err, bytes.TrimSpace(out))
				}
			}
		}
	}
}

// killShims ends the runc shims whose command line names our daemon's
// socket, and their process groups.
func killShims(address string) {
	shim, addr := []byte("containerd-shim"), []byte(address+"\x00")
	killProcs(func(cmdline []byte) bool { return bytes.Contains(cmdline, shim) && bytes.Contains(cmdline, addr) })
}

// UnmountUnder detaches every mount at or below dir, deepest first: what
// a daemon or kubelet left mounted there would keep its files from going.
func UnmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points))) // a mount below another sorts after it
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			fmt.Fprintf(os.Stderr, "sandbox: unmount %s: %v\n", p, err)
		}
	}
}
