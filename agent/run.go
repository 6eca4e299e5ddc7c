package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

// RunConfig is a whole agent, as `gpupin agent` runs one; Run takes it.
// Beside Runtime its zero value is the CLI's safe defaults: the operator's
// overrides file at images.DefaultOverridesPath, provision's lock
// directory (provision.DefaultLockDir, shared with `gpupin provision`),
// NVML for node facts, a periodic pass every DefaultSweepEvery; no wants
// file, API, metrics or NFD file unless named.
type RunConfig struct {
	// Runtime is containerd, in the namespace the pins live in: a
	// *containerd.Runtime (containerd.Connect), or a stand-in that is all
	// of RunRuntime.
	Runtime RunRuntime
	// Provision are the provisioner's options (node facts, GPUs, probe
	// limits, …); the agent adds its logger, its overrides and metrics.
	Provision []provision.Option
	// Loop tunes the converge loop (Recheck, RetryMin, NodeCheck,
	// Parallel). Its OnChange, when set, sees each change after the agent
	// has (the place to start or drain replicas); OnResult is the
	// metrics' when MetricsAddress is set.
	Loop provision.LoopOptions
	// Options are the Agent's (wants file, overrides file, NFD directory,
	// sweep period). OverridesPath "" is images.DefaultOverridesPath here;
	// NoOverridesFile opts out.
	Options
	// Wants are wanted from the start, as PUT /v1/wants would set them:
	// they hold until the wants file (ConfigPath) next changes. nil: the
	// file's, or none.
	Wants []provision.Want
	// Started, when set, is handed the agent once it runs: call its
	// SetWants whenever the wanted engines change, SetOverride, Status.
	Started func(*Agent)
	// Socket is the API's unix socket; "" serves no API.
	Socket string
	// MetricsAddress serves Prometheus metrics on HOST:PORT; "" serves none.
	MetricsAddress string
}

// RunRuntime is everything Run asks of containerd, said in full
// (*containerd.Runtime is all of it): the provisioner's runtime, the
// agent's, and what Run reports of containerd at start. A stand-in that
// lacks a part does not compile.
type RunRuntime interface {
	provision.Runtime
	Runtime
	StartReporter
}

// StartReporter is what Run logs of containerd at start: who keeps pins
// from kubelet's image GC, the node-local names, where layer blobs go.
// Each read writes nothing; one that fails is left out of the log.
type StartReporter interface {
	LocalPrefix() string
	CRIPinning(ctx context.Context) (containerd.CRIPinning, error)
	LocalNames(ctx context.Context) (containerd.LocalNames, error)
	LayerStorage(ctx context.Context) (containerd.LayerStorage, error)
}

var _ RunRuntime = (*containerd.Runtime)(nil)

// withDefaults fills in what the zero value leaves out.
func (cfg RunConfig) withDefaults() RunConfig {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The operator's `gpupin override` must count for an embedded agent
	// as for `gpupin agent`: no file only when asked for.
	if cfg.OverridesPath == "" && !cfg.NoOverridesFile {
		cfg.OverridesPath = defaultOverridesPath
	}
	if cfg.NoOverridesFile {
		cfg.OverridesPath = ""
	}
	return cfg
}

// defaultOverridesPath is images.DefaultOverridesPath; tests move it.
var defaultOverridesPath = images.DefaultOverridesPath

// Run runs an agent until ctx ends: it reads its files (a bad wants file,
// a bad RunConfig.Wants at start, or a provision option New refuses is an
// *InputError), serves the API and
// metrics, watches the files, runs the periodic pass (Maintain: sweep,
// restore pins, check ready pins, NFD file), and converges. It returns
// once every provision in flight has finished its cleanup and every
// background task (servers, watcher, periodic pass) has stopped, so the
// caller may close the runtime then. Nothing is served when a listener
// cannot be made: Run returns that error having closed the others.
func Run(ctx context.Context, cfg RunConfig) error {
	// A nil *containerd.Runtime (a Connect not made) is as nil as none:
	// compared as a value, it is the one a caller leaves by accident.
	if cfg.Runtime == nil || cfg.Runtime == RunRuntime((*containerd.Runtime)(nil)) {
		return errors.New("agent: RunConfig.Runtime is nil")
	}
	cfg = cfg.withDefaults()
	log, rt := cfg.Logger, cfg.Runtime
	var (
		loop    *provision.Loop
		a       *Agent
		metrics *Metrics
	)
	// The agent reads the overrides file itself (watched, and written by
	// its API) and hands the loop what it read.
	popts := append(append([]provision.Option(nil), cfg.Provision...), provision.WithLogger(log), provision.WithOverrides(provision.NewOverrides()))
	lopts := cfg.Loop
	lopts.Logger = log
	if cfg.MetricsAddress != "" {
		metrics = NewMetrics(func() []provision.Status { return loop.Status() }, nil)
		popts = append(popts, provision.WithProgress(metrics.PullProgress))
		lopts.OnResult = metrics.ObserveResult
	}
	// The feature file follows every change of an engine's state; a is set
	// before the loop runs or its wants are set.
	onChange := cfg.Loop.OnChange
	lopts.OnChange = func(st provision.Status) {
		a.StatusChanged(st)
		if onChange != nil {
			onChange(st)
		}
	}
	p, err := provision.New(rt, popts...)
	if err != nil {
		return &InputError{Err: err}
	}
	loop = provision.NewLoop(p, lopts)
	a = New(loop, rt, cfg.Options)
	a.metrics = metrics
	defer rt.OnForeign(nil)
	logContainerd(ctx, log, rt)
	if err := a.Reload(); err != nil {
		// At start there is no last good reading to keep.
		return &InputError{Err: err}
	}
	if cfg.Wants != nil {
		if err := a.SetWants(cfg.Wants); err != nil {
			return err
		}
	}

	var handlers inFlight
	lns, servers, err := listen(cfg, a, metrics, &handlers)
	if err != nil {
		return err
	}

	bctx, stop := context.WithCancel(ctx)
	defer stop()
	var bg sync.WaitGroup
	for i, s := range servers {
		bg.Go(func() { serve(log, s, lns[i]) })
	}
	bg.Go(func() {
		if err := a.Watch(bctx); err != nil {
			log.Error("config files are not watched; changes need a restart or the API (pins are still restored every sweep period)", "err", err)
		}
	})
	// Apart from the watcher: pins come back even where it cannot run.
	bg.Go(func() { a.Maintain(bctx) })
	log.Info("agent started", "socket", cfg.Socket, "config", cfg.ConfigPath, "overrides", cfg.OverridesPath, "namespace", rt.Namespace(),
		"local_prefix", rt.LocalPrefix(), "nfd_features", a.FeaturesPath(), "sweep_every", a.opts.SweepEvery.String(), "pid", os.Getpid())
	if cfg.Started != nil {
		cfg.Started(a)
	}
	loop.Run(ctx)
	stop()
	shutdown(ctx, servers, &handlers)
	bg.Wait()
	log.Info("agent stopped")
	return nil
}

// logContainerd says what the agent found of containerd at start: who keeps
// pins from kubelet's image GC, the node-local names, where layer blobs go.
func logContainerd(ctx context.Context, log *slog.Logger, rt RunRuntime) {
	if cri, err := rt.CRIPinning(ctx); err == nil {
		// Under Kubernetes this decides who keeps a pin from kubelet's
		// image GC: the CRI plugin, or gpupin's restore.
		level := slog.LevelInfo
		if !cri.Kept {
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "containerd "+cri.Version+": "+cri.Note, "namespace", rt.Namespace(), "cri_keeps_pins", cri.Kept,
			"cri_pinning", cri.How, "cri_image", cri.Image)
	}
	if ln, err := rt.LocalNames(ctx); err != nil {
		log.Warn("hosts configuration not read", "err", err)
	} else if ln.Warning != "" {
		log.Warn("node-local names: " + ln.Warning)
	}
	if ls, err := rt.LayerStorage(ctx); err == nil {
		log.Info("layer blobs: "+ls.Summary, "namespace", rt.Namespace(), "hosts_dir", ls.HostsDir)
	}
}

// listen opens every listener before anything serves: a half-served agent
// (an API whose metrics address is taken) would outlive the error Run
// returns. lns[i] is servers[i]'s.
func listen(cfg RunConfig, a *Agent, metrics *Metrics, handlers *inFlight) ([]net.Listener, []*http.Server, error) {
	var (
		lns     []net.Listener
		servers []*http.Server
	)
	if cfg.Socket != "" {
		ln, err := ListenUnix(cfg.Socket)
		if err != nil {
			return nil, nil, err
		}
		lns = append(lns, ln)
		servers = append(servers, &http.Server{Handler: handlers.wrap(a.Handler()), ReadHeaderTimeout: 10 * time.Second})
	}
	if cfg.MetricsAddress != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			for _, ln := range lns {
				ln.Close() // a unix socket's file goes with it
			}
			return nil, nil, fmt.Errorf("metrics address: %w", err)
		}
		lns = append(lns, mln)
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler())
		servers = append(servers, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second})
		cfg.Logger.Info("serving metrics", "address", mln.Addr().String())
	}
	return lns, servers, nil
}

// shutdown stops the servers, giving requests 5 s, and waits for a request
// still at work (a pins read waiting on a pin lock): the caller closes the
// runtime it uses once Run returns.
func shutdown(ctx context.Context, servers []*http.Server, handlers *inFlight) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		if s.Shutdown(sctx) != nil {
			s.Close()
		}
	}
	handlers.close()
}

// inFlight lets requests run until it is closed, and close waits for
// those running; a request that comes later gets 503.
type inFlight struct {
	mu     sync.RWMutex
	closed bool
}

func (f *inFlight) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.RLock()
		defer f.mu.RUnlock()
		if f.closed {
			http.Error(w, "gpupin agent: stopping", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (f *inFlight) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
}

func serve(log *slog.Logger, s *http.Server, ln net.Listener) {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("server stopped", "address", ln.Addr().String(), "err", err)
	}
}
