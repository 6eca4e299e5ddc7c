package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(agentCommand()) }

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:      "agent",
		Usage:     "stay on the node and keep the wanted engines provisioned, with a local API and metrics",
		UsageText: "gpupin agent [--config FILE] [--socket PATH] [--metrics-address HOST:PORT]",
		Description: "Wants (and per-engine overrides) come from --config, which is watched, and from the API on " +
			"--socket: GET /v1/status, PUT /v1/wants, PUT /v1/overrides/{engine}, GET /v1/pins. A change is acted on at " +
			"once; ready engines are re-checked every --recheck; each pin gets a node-local name (--local-prefix, default " +
			"gpupin.local/ENGINE:VERSION) for pods with imagePullPolicy: Never, and, with --nfd-features-dir, a node label through " +
			"node-feature-discovery; a pin that kubelet's image GC or a pull by another client took is restored every 30s; a failure is retried after --retry, doubling up to " +
			"--recheck; a driver or GPU change re-proves every engine. Overrides set through the API are written to " +
			"--overrides, as `gpupin override set` does. SIGTERM stops it after the provisions in flight have cleaned up.",
		Flags: append(append(append([]cli.Flag{
			&cli.StringFlag{Name: "config", Value: agent.DefaultConfigPath, EnvVars: []string{"GPUPIN_AGENT_CONFIG"}, Usage: "the wants file (YAML: wants, overrides); watched"},
			&cli.StringFlag{Name: "socket", Value: agent.DefaultSocket, EnvVars: []string{"GPUPIN_AGENT_SOCKET"}, Usage: "unix socket of the HTTP API"},
			&cli.StringFlag{Name: "metrics-address", EnvVars: []string{"GPUPIN_METRICS_ADDRESS"}, Usage: "serve Prometheus metrics on `HOST:PORT` (/metrics); off when empty"},
			&cli.DurationFlag{Name: "recheck", Value: 10 * time.Minute, Usage: "how often ready engines are checked again"},
			&cli.DurationFlag{Name: "retry", Value: time.Minute, Usage: "first retry after a failure; doubles up to --recheck"},
			&cli.DurationFlag{Name: "node-check", Value: time.Minute, Usage: "how often the node's driver and GPUs are read"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED); re-read at every check"},
			&cli.StringFlag{Name: "nfd-features-dir", Value: agent.DefaultNFDFeaturesDir, EnvVars: []string{"GPUPIN_NFD_FEATURES_DIR"},
				Usage: "node-feature-discovery's local features `DIR`: the agent keeps the file gpupin there, a label gpupin.io/ENGINE-VERSION=VARIANT per ready engine; " +
					"the default is used when it exists (NFD's DaemonSet makes it), a dir given is made; empty: off"},
		}, provisionFlags()...), gpuFlags()...), runtimeFlags()...),
		Action: runAgent,
	}
}

func runAgent(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("agent takes no arguments, got %q (wants come from --config or the API)", c.Args().First()), exitUsage)
	}
	log := slog.Default()
	s, err := openSession(c)
	if err != nil {
		return err
	}
	defer s.close()
	rt := s.rt
	if s.simulated {
		log.Warn("SIMULATED node facts: probes are simulated; nothing is proved on a GPU", "node", lineageString(c, "node"))
	}

	var loop *provision.Loop
	var metrics *agent.Metrics
	popts := []provision.Option{provision.WithLogger(log), provision.WithOverrides(provision.NewOverrides())}
	lopts := provision.LoopOptions{Recheck: c.Duration("recheck"), RetryMin: c.Duration("retry"), NodeCheck: c.Duration("node-check"), Logger: log}
	if c.String("metrics-address") != "" {
		metrics = agent.NewMetrics(func() []provision.Status { return loop.Status() }, nil)
		popts = append(popts, provision.WithProgress(metrics.PullProgress))
		lopts.OnResult = metrics.ObserveResult
	}
	nfdDir := c.String("nfd-features-dir")
	if nfdDir != "" && !c.IsSet("nfd-features-dir") {
		if st, err := os.Stat(nfdDir); err != nil || !st.IsDir() {
			log.Info("no node-feature-discovery features directory: no node labels (give --nfd-features-dir to make one)", "dir", nfdDir)
			nfdDir = ""
		}
	}
	var a *agent.Agent
	// The feature file follows every change of an engine's state; a is
	// set before the loop runs or its wants are set.
	lopts.OnChange = func(st provision.Status) { a.StatusChanged(st) }
	loop = provision.NewLoop(s.provisioner(popts...), lopts)
	a = agent.New(loop, rt, agent.Options{ConfigPath: c.String("config"), OverridesPath: lineageString(c, "overrides"),
		Logger: log, NFDFeaturesDir: nfdDir})
	if cri, err := rt.CRIPinning(c.Context); err == nil {
		// Under Kubernetes this decides who keeps a pin from kubelet's
		// image GC: the CRI plugin, or gpupin's restore.
		level := slog.LevelInfo
		if !cri.Kept {
			level = slog.LevelWarn
		}
		log.Log(c.Context, level, "containerd "+cri.Version+": "+cri.Note, "namespace", rt.Namespace(), "cri_keeps_pins", cri.Kept)
	}
	if err := a.Reload(); err != nil {
		// At start there is no last good reading to keep.
		return cli.Exit(err.Error(), exitUsage)
	}

	ln, err := agent.ListenUnix(c.String("socket"))
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	defer os.Remove(c.String("socket"))
	api := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go serve(log, "api", api, ln)
	servers := []*http.Server{api}
	if addr := c.String("metrics-address"); addr != "" {
		mln, err := net.Listen("tcp", addr)
		if err != nil {
			return cli.Exit(fmt.Sprintf("--metrics-address: %v", err), exitError)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go serve(log, "metrics", ms, mln)
		servers = append(servers, ms)
		log.Info("serving metrics", "address", mln.Addr().String())
	}

	ctx := c.Context
	go func() {
		if err := a.Watch(ctx); err != nil {
			log.Error("config files are not watched; changes need a restart or the API", "err", err)
		}
	}()
	log.Info("agent started", "socket", c.String("socket"), "config", c.String("config"),
		"namespace", rt.Namespace(), "local_prefix", rt.LocalPrefix(), "nfd_features", a.FeaturesPath(), "pid", os.Getpid())
	// Run returns once ctx ends (SIGTERM, SIGINT) and every provision in
	// flight has finished its cleanup.
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
