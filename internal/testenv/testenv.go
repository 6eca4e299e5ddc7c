// Package testenv gives tests the real parts: one private containerd per
// test binary, a loopback registry per test (go-containerregistry's in
// process, or Debian's docker-registry), and a runtime in a namespace of
// the test's own.
//
// The containerd is Debian's 1.6 from PATH, or the one named by
// $GPUPIN_TEST_CONTAINERD (sandbox.EnvContainerd): `make test` runs every
// package against both.
//
// Under -short (`make test-short`) nothing is started: every test that
// asks for a daemon, a built binary or root skips (Daemons), and what
// remains is the fast tier of pure logic. `make test` never passes -short.
package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

var daemon *sandbox.Containerd

// needsRoot is why tests that run containers skip: they start containerd
// and runc, which need root. `make test` and CI run as root (make test
// refuses to run otherwise), so there they always run; a missing binary
// as root is a failure, never a skip.
const needsRoot = "needs root: starts containerd and runs containers (run as root, as make test and CI do)"

// Main starts the package's containerd around its tests and exits with
// their result. Use from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// As non-root it starts nothing and the tests that need containerd skip
// (Containerd, Runtime and OwnContainerd call t.Skip); the others run.
// As root, a containerd that does not start fails the whole package.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main that returns the exit code instead of exiting, for a
// TestMain with cleanup of its own to do after the tests (os.Exit skips
// deferred calls):
//
//	code := testenv.Run(m)
//	os.RemoveAll(dir)
//	os.Exit(code)
func Run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "testenv: not root: tests that need containerd skip ("+needsRoot+")")
		return m.Run()
	}
	d, err := sandbox.StartContainerd(context.Background(), sandbox.ContainerdOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start containerd:", err)
		return 1
	}
	daemon = d
	defer func() { d.Stop(); daemon = nil }()
	// The probe programs are bind-mounted from the host: built once per
	// test binary, found through GPUPIN_LIBDIR as an installed gpupin's are.
	bins := filepath.Join(d.Dir, "probe-bin")
	if err := sandbox.BuildProbeBinaries(context.Background(), bins); err != nil {
		fmt.Fprintln(os.Stderr, "build the probe binaries:", err)
		return 1
	}
	os.Setenv(probe.EnvLibDir, bins)
	return m.Run()
}

// Daemons skips the test under -short: it needs a daemon (containerd,
// Debian's docker-registry, kube-apiserver, kubelet), programs built for
// it, or root. The fast tier is what runs without them.
func Daemons(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs a daemon, built programs or root (make test runs it)")
	}
}

// RequireRoot skips the test unless it runs as root (and under -short).
func RequireRoot(t testing.TB) {
	t.Helper()
	Daemons(t)
	if os.Geteuid() != 0 {
		t.Skip(needsRoot)
	}
}

// Containerd returns the package's daemon.
func Containerd(t testing.TB) *sandbox.Containerd {
	t.Helper()
	RequireRoot(t)
	if daemon == nil {
		t.Fatal("testenv.Main was not called from TestMain")
	}
	return daemon
}

// Registry starts a loopback registry for one test.
func Registry(t testing.TB) *sandbox.Registry {
	t.Helper()
	r, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

var nonAlnum = regexp.MustCompile(`[^a-zA-Z0-9]+`)

var (
	nsMu    sync.Mutex
	nsOf    = map[testing.TB]string{}
	nsTimes = map[string]int{}
)

// Namespace is a containerd namespace named after the test, the same for
// every call in one test. A test run again (-count) gets a fresh one: the
// daemon outlives the run, and what the first run left must not count.
func Namespace(t testing.TB) string {
	nsMu.Lock()
	defer nsMu.Unlock()
	if ns, ok := nsOf[t]; ok {
		return ns
	}
	ns := strings.Trim(nonAlnum.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(ns) > 60 {
		ns = strings.TrimRight(ns[:60], "-")
	}
	ns = "t-" + ns
	nsTimes[ns]++
	if n := nsTimes[ns]; n > 1 {
		ns = fmt.Sprintf("%s-%d", ns, n)
	}
	nsOf[t] = ns
	return ns
}

// Runtime connects to the package's containerd in the test's namespace,
// with a CDI spec directory of the test's own.
func Runtime(t testing.TB, opts ...containerd.Opt) *containerd.Runtime {
	t.Helper()
	return connect(t, Containerd(t), opts...)
}

// OwnContainerd starts a containerd for one test (one it may restart, kill
// or starve of disk without touching the others) and connects to it.
func OwnContainerd(t testing.TB, opts sandbox.ContainerdOptions) (*sandbox.Containerd, *containerd.Runtime) {
	t.Helper()
	RequireRoot(t)
	d, err := sandbox.StartContainerd(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, connect(t, d)
}

func connect(t testing.TB, d *sandbox.Containerd, opts ...containerd.Opt) *containerd.Runtime {
	t.Helper()
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	os.MkdirAll(cdiDir, 0o755)
	// A test's GPUPIN_UNPACK picks the strategy, as the CLI's does.
	unpack, err := containerd.ParseUnpack(os.Getenv(containerd.EnvUnpack))
	if err != nil {
		t.Fatal(err)
	}
	base := []containerd.Opt{
		containerd.WithUnpack(unpack),
		containerd.WithNamespace(Namespace(t)),
		containerd.WithRuncRoot(d.RuncRoot),
		containerd.WithFIFODir(filepath.Join(d.Dir, "fifo")),
		containerd.WithCDISpecDirs(cdiDir),
	}
	rt, err := containerd.Connect(context.Background(), d.Address, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// Provisioner is provision.New that fails the test on an error.
func Provisioner(t testing.TB, rt provision.Runtime, opts ...provision.Option) *provision.Provisioner {
	t.Helper()
	p, err := provision.New(rt, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Context is a background context in rt's namespace, for calls a test
// makes on rt's client directly.
func Context(rt *containerd.Runtime) context.Context {
	return namespaces.WithNamespace(context.Background(), rt.Namespace())
}
