// Package herd simulates a fleet rollout on one machine with real parts:
// N nodes, each its own containerd and a real Spegel v0.7.4 beside it as
// that node's peer-to-peer mirror (configured through certs.d/hosts.toml,
// written by `spegel configuration` as Spegel's chart does), one upstream
// registry that counts the blob bytes it serves, and one kube-apiserver
// for gpupin's fetch gate (package fetchgate).
//
// Spegel advertises only non-loopback addresses and assumes every peer
// serves its registry on the same port, so each simulated node needs an
// address of its own. Main re-runs the test binary in a private network
// namespace (unshare --net) whose lo carries 127.0.0.1 and 10.99.0.1–64:
// nothing leaves the machine and nothing on the host's network changes.
package herd

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"golang.org/x/time/rate"

	"github.com/gpupin/gpupin/internal/testenv"
)

// envInside marks the re-run inside the private network namespace.
const envInside = "GPUPIN_HERD_NETNS"

// MaxNodes is how many node addresses the namespace's lo carries.
const MaxNodes = 64

// Addr is node i's own address (i from 0).
func Addr(i int) string { return "10.99.0." + strconv.Itoa(i+1) }

// Main runs the package's tests in a private network namespace (as root,
// not under -short), then as testenv.Main does. Use from TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main returning the exit code.
func Run(m *testing.M) int {
	if os.Getenv(envInside) == "" && os.Geteuid() == 0 && !short() {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "herd: the test binary's path:", err)
			return 1
		}
		cmd := exec.Command("unshare", append([]string{"--net", "--", self}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), envInside+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Run(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			fmt.Fprintln(os.Stderr, "herd: unshare --net:", err)
			return 1
		}
		return 0
	}
	if os.Getenv(envInside) != "" {
		if err := upLoopback(); err != nil {
			fmt.Fprintln(os.Stderr, "herd:", err)
			return 1
		}
	}
	return testenv.Run(m)
}

// short reads -test.short before flag.Parse (testenv.Run parses).
func short() bool {
	for _, a := range os.Args[1:] {
		if a == "-test.short" || a == "-test.short=true" {
			return true
		}
	}
	return false
}

func upLoopback() error {
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %w: %s", err, out)
	}
	for i := range MaxNodes {
		if out, err := exec.Command("ip", "addr", "add", Addr(i)+"/32", "dev", "lo").CombinedOutput(); err != nil {
			return fmt.Errorf("ip addr add %s: %w: %s", Addr(i), err, out)
		}
	}
	return nil
}

// Inside reports whether the process runs in the herd's network
// namespace (where the node addresses exist).
func Inside() bool { return os.Getenv(envInside) != "" }

// RepoRoot is the module's root directory (for the deploy manifests).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Spegel is the cached Spegel binary ($GPUPIN_TOOLS/spegel, built by
// scripts/spegel.sh, which scripts/deps.sh runs).
func Spegel() string { return filepath.Join(testenv.ToolsDir(), "spegel") }

// Upstream is the registry the images come from: go-containerregistry's
// on loopback, counting the blob bytes it serves (what a fleet pays its
// registry for), optionally at a bounded rate per response (a slow link,
// so a test can act while a pull is under way) or over all of them (the
// fleet's one link to its registry, which every node's fetch shares).
type Upstream struct {
	Host string // 127.0.0.1 (port 80)

	srv       *http.Server
	handler   http.Handler
	blobBytes atomic.Int64
	rate      atomic.Int64                 // bytes per second per response; 0: no limit
	link      atomic.Pointer[rate.Limiter] // bytes per second over all responses; nil: no limit
}

// StartUpstream serves a registry on 127.0.0.1:80 (in the herd's own
// network namespace, where the port is free), blobs in dir ("" = memory).
//
// Port 80, not a free one: containerd's pull (and gpupin's, which labels
// as it does) names a blob's source by host without its port
// (containerd.io/distribution.source.127.0.0.1=vllm), and Spegel, told to
// mirror http://127.0.0.1:PORT, filters out the blobs of "127.0.0.1" as
// another registry's: it would advertise nothing. A registry without a
// port, as real ones are, is what Spegel serves.
func StartUpstream(dir string) (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:80")
	if err != nil {
		return nil, fmt.Errorf("upstream registry: %w", err)
	}
	opts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if dir != "" {
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(dir)))
	}
	u := &Upstream{Host: "127.0.0.1", handler: registry.New(opts...)}
	u.srv = &http.Server{Handler: u, ErrorLog: log.New(io.Discard, "", 0)}
	go u.srv.Serve(ln)
	return u, nil
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
		w = &countingWriter{ResponseWriter: w, u: u, ctx: r.Context()}
	}
	u.handler.ServeHTTP(w, r)
}

// BlobBytes is what the registry has served of blobs so far.
func (u *Upstream) BlobBytes() int64 { return u.blobBytes.Load() }

// ResetCount starts the count again.
func (u *Upstream) ResetCount() { u.blobBytes.Store(0) }

// SetRate limits each blob response to bps bytes a second (0: none).
func (u *Upstream) SetRate(bps int64) { u.rate.Store(bps) }

// SetLink limits the blob bytes of all responses together to bps a second
// (0: none): the upstream link, not the nodes' CPUs, bounds a rollout then,
// as it does a fleet's pulls of a 20 GB image.
func (u *Upstream) SetLink(bps int64) {
	if bps <= 0 {
		u.link.Store(nil)
		return
	}
	u.link.Store(rate.NewLimiter(rate.Limit(bps), linkChunk))
}

// linkChunk is what a response writes at a time under a rate.
const linkChunk = 64 << 10

// Close stops the registry.
func (u *Upstream) Close() error { return u.srv.Close() }

type countingWriter struct {
	http.ResponseWriter
	u   *Upstream
	ctx context.Context
}

func (c *countingWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		chunk := p
		if bps := c.u.rate.Load(); bps > 0 {
			// 64 KiB at a time, each after its share of a second: the
			// limit holds for every response, whatever its size.
			chunk = p[:min(len(p), linkChunk)]
			select {
			case <-time.After(time.Duration(int64(len(chunk)) * int64(time.Second) / bps)):
			case <-c.ctx.Done():
				return written, c.ctx.Err()
			}
		}
		if l := c.u.link.Load(); l != nil {
			chunk = chunk[:min(len(chunk), linkChunk)]
			if err := l.WaitN(c.ctx, len(chunk)); err != nil {
				return written, err
			}
		}
		n, err := c.ResponseWriter.Write(chunk)
		written += n
		c.u.blobBytes.Add(int64(n))
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// SpegelProc is one node's running Spegel.
type SpegelProc struct {
	Addr string // the node's address; the registry serves on Addr:5000
	args []string
	log  *os.File

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Spegel's ports, the same on every node, as the chart has them.
const (
	RegistryPort  = 5000
	RouterPort    = 5001
	BootstrapPort = 5002
	MetricsPort   = 9090
)

// MirrorURL is the mirror's address as hosts.toml names it.
func (s *SpegelProc) MirrorURL() string {
	return "http://" + net.JoinHostPort(s.Addr, strconv.Itoa(RegistryPort))
}

// StartSpegel runs `spegel registry` for the containerd at sock (content
// under contentDir), on addr, bootstrapping over HTTP from leader's
// bootstrap server (as the chart's nodes all name one), mirroring the
// registry upstream ("http://host:port"). Its log goes to dir/spegel.log.
func StartSpegel(dir, addr, leader, sock, contentDir, upstream string) (*SpegelProc, error) {
	bin := Spegel()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("spegel v0.7.4 missing (%w): run scripts/spegel.sh (scripts/deps.sh does)", err)
	}
	hp := func(port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }
	s := &SpegelProc{Addr: addr, args: []string{bin, "registry",
		"--containerd-sock", sock,
		// k8s.io: where the CRI keeps a node's images, and where gpupin
		// pulls under Kubernetes; Spegel serves only this namespace.
		"--containerd-namespace", "k8s.io",
		"--containerd-content-path", contentDir,
		"--data-dir", filepath.Join(dir, "spegel-data"),
		"--registry-addr", hp(RegistryPort),
		"--router-addr", hp(RouterPort),
		"--metrics-addr", hp(MetricsPort),
		"--bootstrap-kind", "http",
		"--http-bootstrap-addr", hp(BootstrapPort),
		"--http-bootstrap-peer", "http://" + net.JoinHostPort(leader, strconv.Itoa(BootstrapPort)),
		"--mirrored-registries", upstream,
		// The chart's 20 ms is for idle nodes; on a loaded 2-core CI
		// machine a DHT lookup of a layer a peer has can take longer, and
		// a miss then costs an upstream fetch. 500 ms keeps a real miss
		// cheap next to a pull.
		"--mirror-resolve-timeout", "500ms",
		"--debug-web-enabled=false",
	}}
	if err := os.MkdirAll(filepath.Join(dir, "spegel-data"), 0o755); err != nil {
		return nil, fmt.Errorf("spegel: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "spegel.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("spegel log: %w", err)
	}
	s.log = f
	return s, s.Start()
}

// Start starts (or restarts) Spegel and waits until its registry answers.
func (s *SpegelProc) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start spegel on %s: %w", s.Addr, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	done := s.done
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// /livez: the registry serves. Readiness (/readyz: a peer in the
		// routing table) needs the other nodes up: WaitReady.
		resp, err := http.Get("http://" + net.JoinHostPort(s.Addr, strconv.Itoa(RegistryPort)) + "/livez")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("spegel on %s exited at start: %s", s.Addr, s.LogTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("spegel on %s not ready in 30s (last: %v): %s", s.Addr, err, s.LogTail())
		}
	}
}

// WaitReady waits until Spegel says it is ready (/readyz: it has a peer),
// as the chart's readiness probe does before a node counts.
func (s *SpegelProc) WaitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get("http://" + net.JoinHostPort(s.Addr, strconv.Itoa(RegistryPort)) + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz: %s", resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("spegel on %s not ready in %s (last: %v): %s", s.Addr, within, err, s.LogTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Kill kills Spegel (SIGKILL: a node that dies says nothing).
func (s *SpegelProc) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Stop kills Spegel and closes its log.
func (s *SpegelProc) Stop() {
	s.Kill()
	s.log.Close()
}

// LogTail is the end of Spegel's log.
func (s *SpegelProc) LogTail() string {
	b, _ := os.ReadFile(s.log.Name())
	if len(b) > 30000 {
		b = b[len(b)-30000:]
	}
	return string(b)
}

// WriteHostsToml has Spegel write node's certs.d for upstream (scheme and
// host) with mirror first, as its chart's init container does.
func WriteHostsToml(certsDir, upstream, mirror string) error {
	out, err := exec.Command(Spegel(), "configuration",
		"--containerd-registry-config-path", certsDir,
		"--mirrored-registries", upstream,
		"--mirror-targets", mirror,
		// gpupin pulls by digest; resolving tags through peers would
		// only add a lookup to the resolution.
		"--resolve-tags=false").CombinedOutput()
	if err != nil {
		return fmt.Errorf("spegel configuration: %w: %s", err, out)
	}
	return nil
}
