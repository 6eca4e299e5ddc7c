package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/fsnotify/fsnotify"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// running is an agent.Run in the background.
type running struct {
	agent *agent.Agent
	stop  func() error // cancels and returns what Run returned
}

// publishDemo publishes demo:1.0 (cu13, cu129) to a registry of the test's own.
func publishDemo(t *testing.T) (*sandbox.Registry, string) {
	t.Helper()
	reg := testenv.Registry(t)
	return reg, sandbox.MustPublishEngineAs(t, reg.Host+"/demo", "demo", "1.0", cu13, cu129)
}

// simulated are the provisioner's options of a simulated H100 on driver
// 575 (CUDA 12.9: cu129 is proved), with the test's own directories.
func simulated(t *testing.T) []provision.Option {
	return []provision.Option{provision.WithNode(node.Static{Facts: h100("575.57.08", "12.9")}),
		provision.WithLockDir(t.TempDir()), provision.WithProbeTimeout(30 * time.Second), provision.WithProbeDir(t.TempDir())}
}

// startRun runs agent.Run until the test ends (or stop), and returns once
// it has started.
func startRun(t *testing.T, cfg agent.RunConfig) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	started := make(chan *agent.Agent, 1)
	cfg.Started = func(a *agent.Agent) { started <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg) }()
	r := &running{}
	var once sync.Once
	var runErr error
	r.stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { r.stop() })
	select {
	case r.agent = <-started:
		return r
	case err := <-done:
		done <- err // for stop
		t.Fatalf("agent.Run returned before it started: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent.Run did not start within 30s")
	}
	return nil
}

func (r *running) waitFor(t *testing.T, within time.Duration, what string, ok func([]provision.Status) bool) []provision.Status {
	t.Helper()
	w := &world{agent: r.agent}
	return w.waitFor(t, within, what, ok)
}

// Run's zero value reads the operator's overrides file where the CLI
// does; an embedder opts out in so many words.
func TestRunSimulatedDefaultsReadTheOverridesFile(t *testing.T) {
	_, ref := publishDemo(t)
	def := filepath.Join(t.TempDir(), "overrides.yaml")
	defer agent.SetDefaultOverridesPath(def)()
	if err := os.WriteFile(def, []byte("overrides:\n  demo: none\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		opts  agent.Options
		state provision.State
	}{
		{"zero value: the default file's none holds", agent.Options{}, provision.Disabled},
		{"NoOverridesFile: auto", agent.Options{NoOverridesFile: true}, provision.Ready},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRun(t, agent.RunConfig{Runtime: testenv.Runtime(t), Provision: simulated(t), Options: tc.opts,
				Wants: []provision.Want{{Ref: ref}}})
			r.waitFor(t, 60*time.Second, string(tc.state), func(sts []provision.Status) bool {
				return len(sts) == 1 && sts[0].State == tc.state
			})
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// unixSocketOpen reports whether a unix socket bound to path is still open
// in this network namespace; /proc/net/unix lists it even after its file
// is removed.
func unixSocketOpen(t *testing.T, path string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 8 && f[len(f)-1] == path {
			return true
		}
	}
	return false
}

// A metrics address already in use: Run fails, and the API it could
// listen on is not left serving behind the error.
func TestRunMetricsAddressTakenLeavesNoAPI(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	err = agent.Run(context.Background(), agent.RunConfig{Runtime: testenv.Runtime(t), Provision: simulated(t),
		Options: agent.Options{NoOverridesFile: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Socket:  sock, MetricsAddress: taken.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "metrics address") {
		t.Fatalf("Run = %v; want the metrics address refused", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the API socket file is left: %v", err)
	}
	if unixSocketOpen(t, sock) {
		t.Errorf("the API socket %s is still open after Run returned", sock)
	}
}

// slowRecoverer is a Recover that is still cleaning up for a while after
// its context ends, as a restore in flight would be.
type slowRecoverer struct {
	started  chan struct{}
	once     sync.Once
	finished atomic.Bool
}

func (s *slowRecoverer) Recover(ctx context.Context) ([]containerd.Recovered, error) {
	s.once.Do(func() { close(s.started) })
	<-ctx.Done()
	time.Sleep(300 * time.Millisecond)
	s.finished.Store(true)
	return nil, ctx.Err()
}

// Run returns only once its periodic pass has finished: the caller closes
// the runtime right after.
func TestRunWaitsForItsPeriodicPass(t *testing.T) {
	rec := &slowRecoverer{started: make(chan struct{})}
	r := startRun(t, agent.RunConfig{Runtime: testenv.Runtime(t), Provision: simulated(t),
		Options: agent.Options{NoOverridesFile: true, Recoverer: rec, SweepEvery: 10 * time.Millisecond}})
	select {
	case <-rec.started:
	case <-time.After(30 * time.Second):
		t.Fatal("no periodic pass within 30s")
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if !rec.finished.Load() {
		t.Fatal("Run returned while its periodic pass was still in flight")
	}
}

// Where no file watcher can be made (inotify exhausted), the periodic
// pass still runs: a pin deleted by another client is back within a few
// sweep periods, not at the next 10-minute recheck.
func TestRunSimulatedRestoresPinsWithoutAFileWatcher(t *testing.T) {
	_, ref := publishDemo(t)
	defer agent.SetNewWatcher(func() (*fsnotify.Watcher, error) {
		return nil, fmt.Errorf("inotify_init1: too many open files")
	})()
	rt := testenv.Runtime(t)
	const every = 100 * time.Millisecond
	r := startRun(t, agent.RunConfig{Runtime: rt, Provision: simulated(t),
		Options: agent.Options{NoOverridesFile: true, SweepEvery: every, ConfigPath: filepath.Join(t.TempDir(), "agent.yaml")},
		Wants:   []provision.Want{{Engine: "demo", Version: "1.0", Ref: ref}}})
	r.waitFor(t, 60*time.Second, "ready", one(provision.Ready, "cu129"))
	select {
	case <-r.agent.Watching():
		t.Fatal("Watch says it watches, with no watcher")
	default:
	}
	pin, err := rt.GetPin(context.Background(), "demo:1.0")
	if err != nil || pin == nil || pin.Local == "" {
		t.Fatalf("pin %+v, %v", pin, err)
	}
	nsctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	is := rt.Client().ImageService()
	for _, name := range []string{pin.Ref, pin.Local} {
		if err := is.Delete(nsctx, name, images.SynchronousDelete()); err != nil {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	waitUntil(t, 50*every+5*time.Second, "the pin and its local name restored", func() bool {
		_, err1 := is.Get(nsctx, pin.Ref)
		_, err2 := is.Get(nsctx, pin.Local)
		return err1 == nil && err2 == nil
	})
	t.Logf("restored %s after the delete (sweep period %s)", time.Since(deleted).Round(time.Millisecond), every)
}

// `gpupin unpin` beside a running agent: the engine's node label goes
// within a sweep period (pods must not land where ErrImageNeverPull
// awaits them) and the engine is not reported ready; once the registry is
// back it is proved and labelled again.
func TestRunSimulatedExternalUnpinDropsTheNodeLabel(t *testing.T) {
	reg, ref := publishDemo(t)
	rt := testenv.Runtime(t)
	dir := filepath.Join(t.TempDir(), "features.d")
	const every = 100 * time.Millisecond
	r := startRun(t, agent.RunConfig{Runtime: rt, Provision: simulated(t),
		// Recheck stays at its 10 minutes: only the periodic pass can notice.
		Loop:    provision.LoopOptions{RetryMin: 200 * time.Millisecond},
		Options: agent.Options{NoOverridesFile: true, SweepEvery: every, NFDFeaturesDir: dir},
		Wants:   []provision.Want{{Engine: "demo", Version: "1.0", Ref: ref}}})
	labels := func() map[string]string {
		if _, err := os.Stat(filepath.Join(dir, agent.NFDFileName)); err != nil {
			return map[string]string{}
		}
		return nfdLabelsLive(t, dir)
	}
	r.waitFor(t, 60*time.Second, "ready", one(provision.Ready, "cu129"))
	waitUntil(t, 10*time.Second, "the node label", func() bool { return labels()["gpupin.io/demo-1.0"] == "cu129" })
	first, err := rt.GetPin(context.Background(), "demo:1.0")
	if err != nil || first == nil {
		t.Fatalf("pin %+v, %v", first, err)
	}

	// The registry is down, so the engine cannot be proved again meanwhile.
	reg.SetDown(true)
	if _, err := rt.Unpin(context.Background(), "demo:1.0"); err != nil {
		t.Fatal(err)
	}
	unpinned := time.Now()
	waitUntil(t, 20*every+5*time.Second, "the node label removed", func() bool { return len(labels()) == 0 })
	t.Logf("label removed %s after the unpin (sweep period %s)", time.Since(unpinned).Round(time.Millisecond), every)
	r.waitFor(t, 30*time.Second, "not ready", func(sts []provision.Status) bool {
		return len(sts) == 1 && sts[0].State == provision.Failed
	})
	if got := labels(); len(got) != 0 {
		t.Fatalf("labels %v while the engine has no pin", got)
	}

	reg.SetDown(false)
	r.waitFor(t, 60*time.Second, "ready again", one(provision.Ready, "cu129"))
	waitUntil(t, 10*time.Second, "the node label back", func() bool { return labels()["gpupin.io/demo-1.0"] == "cu129" })
	again, err := rt.GetPin(context.Background(), "demo:1.0")
	if err != nil || again == nil || again.Local != "gpupin.local/demo:1.0" || again.Digest != first.Digest {
		t.Fatalf("pin after re-provision %+v, %v; want %s with its local name", again, err, first.Digest)
	}
}
