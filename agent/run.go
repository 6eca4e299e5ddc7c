package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/runtime"
)

// RunConfig is a whole agent, as `gpupin agent` runs one; Run takes it.
type RunConfig struct {
	// Runtime is containerd, in the namespace the pins live in.
	Runtime *runtime.Runtime
	// Provision are the provisioner's options (node facts, GPUs, probe
	// limits, …); the agent adds its logger, in-memory overrides and
	// metrics to them.
	Provision []provision.Option
	// Loop tunes the converge loop (Recheck, RetryMin, NodeCheck,
	// Parallel); its callbacks are the agent's.
	Loop provision.LoopOptions
	// Options are the Agent's (wants file, overrides file, NFD directory,
	// sweep period).
	Options
	// Socket is the API's unix socket; "" serves no API.
	Socket string
	// MetricsAddress serves Prometheus metrics on HOST:PORT; "" serves none.
	MetricsAddress string
}

// Run runs an agent until ctx ends: it reads its files (a bad wants file
// at start is an *InputError), serves the API and metrics, watches the
// files, sweeps and restores pins on a timer, and converges. It returns
// once every provision in flight has finished its cleanup.
func Run(ctx context.Context, cfg RunConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
		cfg.Logger = log
	}
	rt := cfg.Runtime
	var (
		loop    *provision.Loop
		a       *Agent
		metrics *Metrics
	)
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
	lopts.OnChange = func(st provision.Status) { a.StatusChanged(st) }
	loop = provision.NewLoop(provision.New(rt, popts...), lopts)
	a = New(loop, rt, cfg.Options)
	if cri, err := rt.CRIPinning(ctx); err == nil {
		// Under Kubernetes this decides who keeps a pin from kubelet's
		// image GC: the CRI plugin, or gpupin's restore.
		level := slog.LevelInfo
		if !cri.Kept {
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "containerd "+cri.Version+": "+cri.Note, "namespace", rt.Namespace(), "cri_keeps_pins", cri.Kept)
	}
	if err := a.Reload(); err != nil {
		// At start there is no last good reading to keep.
		return &InputError{Err: err}
	}

	var servers []*http.Server
	if cfg.Socket != "" {
		ln, err := ListenUnix(cfg.Socket)
		if err != nil {
			return err
		}
		defer os.Remove(cfg.Socket)
		api := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go serve(log, "api", api, ln)
		servers = append(servers, api)
	}
	if cfg.MetricsAddress != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics address: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go serve(log, "metrics", ms, mln)
		servers = append(servers, ms)
		log.Info("serving metrics", "address", mln.Addr().String())
	}
	go func() {
		if err := a.Watch(ctx); err != nil {
			log.Error("config files are not watched; changes need a restart or the API", "err", err)
		}
	}()
	log.Info("agent started", "socket", cfg.Socket, "config", cfg.ConfigPath, "namespace", rt.Namespace(),
		"local_prefix", rt.LocalPrefix(), "nfd_features", a.FeaturesPath(), "pid", os.Getpid())
	loop.Run(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(sctx)
	}
	log.Info("agent stopped")
	return nil
}

func serve(log *slog.Logger, name string, s *http.Server, ln net.Listener) {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("server stopped", "server", name, "err", err)
	}
}
