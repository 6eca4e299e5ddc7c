// Package testenv gives tests the real parts: one private containerd per
// test binary, a loopback registry per test, and a runtime in a namespace
// of the test's own.
package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/runtime"
)

var daemon *sandbox.Containerd

// Main starts the package's containerd around its tests. Use from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "these tests run containers: run them as root (CI does)")
		os.Exit(1)
	}
	d, err := sandbox.StartContainerd(context.Background(), sandbox.ContainerdOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start containerd:", err)
		os.Exit(1)
	}
	daemon = d
	code := m.Run()
	d.Stop()
	os.Exit(code)
}

// Containerd returns the package's daemon.
func Containerd(t testing.TB) *sandbox.Containerd {
	t.Helper()
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
		ns = ns[:60]
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
func Runtime(t testing.TB, opts ...runtime.Opt) *runtime.Runtime {
	t.Helper()
	return connect(t, Containerd(t), opts...)
}

// OwnContainerd starts a containerd for one test (one it may restart, kill
// or starve of disk without touching the others) and connects to it.
func OwnContainerd(t testing.TB, opts sandbox.ContainerdOptions) (*sandbox.Containerd, *runtime.Runtime) {
	t.Helper()
	d, err := sandbox.StartContainerd(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, connect(t, d)
}

func connect(t testing.TB, d *sandbox.Containerd, opts ...runtime.Opt) *runtime.Runtime {
	t.Helper()
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	os.MkdirAll(cdiDir, 0o755)
	base := []runtime.Opt{
		runtime.WithNamespace(Namespace(t)),
		runtime.WithRuncRoot(d.RuncRoot),
		runtime.WithFIFODir(filepath.Join(d.Dir, "fifo")),
		runtime.WithCDISpecDirs(cdiDir),
	}
	rt, err := runtime.Connect(context.Background(), d.Address, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}
