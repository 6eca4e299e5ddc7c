package main

import (
	"errors"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(agentCommand) }

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:      "agent",
		Usage:     "stay on the node and keep the wanted engines provisioned, with a local API and metrics",
		UsageText: "gpupin agent [--config FILE] [--socket PATH] [--metrics-address HOST:PORT]",
		Description: "Wants (and per-engine overrides) come from --config, which is watched, and from the API on " +
			"--socket: GET /v1/status, PUT /v1/wants, PUT /v1/overrides/{engine}, GET /v1/pins. A change is acted on at " +
			"once; ready engines are re-checked every --recheck; each pin gets a node-local name (--local-prefix, default " +
			"gpupin.local/ENGINE:VERSION) for pods with imagePullPolicy: Never, and, with --nfd-features-dir, a node label through " +
			"node-feature-discovery; a pin that kubelet's image GC or a pull by another client took is restored every --sweep-every, and a record of a local name that gpupin did not write " +
			"(pulled from a peer through a mirror, made by hand) is replaced or removed and reported; a failure is retried after --retry, doubling up to " +
			"--recheck; a driver or GPU change re-proves every engine. Overrides set through the API are written to " +
			"--overrides, as `gpupin override set` does. SIGTERM stops it after the provisions in flight have cleaned up.",
		Flags: append(append(append([]cli.Flag{
			&cli.StringFlag{Name: "config", Value: agent.DefaultConfigPath, EnvVars: []string{"GPUPIN_AGENT_CONFIG"}, Usage: "the wants file (YAML: wants, overrides); watched"},
			&cli.StringFlag{Name: "socket", Value: agent.DefaultSocket, EnvVars: []string{"GPUPIN_AGENT_SOCKET"}, Usage: "unix socket of the HTTP API"},
			&cli.StringFlag{Name: "metrics-address", EnvVars: []string{"GPUPIN_METRICS_ADDRESS"}, Usage: "serve Prometheus metrics on `HOST:PORT` (/metrics); off when empty"},
			&cli.DurationFlag{Name: "recheck", Value: provision.DefaultRecheck, Usage: "how often ready engines are checked again"},
			&cli.DurationFlag{Name: "retry", Value: provision.DefaultRetryMin, Usage: "first retry after a failure; doubles up to --recheck"},
			&cli.DurationFlag{Name: "node-check", Value: provision.DefaultNodeCheck, Usage: "how often the node's driver and GPUs are read"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED); re-read at every check"},
			&cli.DurationFlag{Name: "sweep-every", Value: agent.DefaultSweepEvery, Usage: "how often leftovers of dead gpupin processes are swept and pins other clients took are restored"},
			&cli.StringFlag{Name: "nfd-features-dir", Value: agent.DefaultNFDFeaturesDir, EnvVars: []string{"GPUPIN_NFD_FEATURES_DIR"},
				Usage: "node-feature-discovery's local features `DIR`: the agent keeps the file gpupin there, a label gpupin.io/ENGINE-VERSION=VARIANT per ready engine; " +
					"the default is used when it exists (NFD's DaemonSet makes it), a dir given is made; empty: off"},
			&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"},
				Usage: "the Kubernetes Node `NAME` this agent runs on: turns on the fleet layer (docs/fleet.md): EngineOverrides from the API, " +
					"the node's GPUPinNode status, Events on the Node; empty: off"},
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig `FILE` for the fleet layer (default: in-cluster, else as kubectl finds one)"},
			&cli.StringFlag{Name: "wants-configmap", EnvVars: []string{"GPUPIN_WANTS_CONFIGMAP"},
				Usage: "with --node-name: also read the wants from the ConfigMap `NAMESPACE/NAME` (key agent.yaml) through the API, applied on change rather than on kubelet's volume sync"},
			&cli.StringFlag{Name: "fleet-cache", Value: fleet.DefaultCachePath,
				Usage: "where the last cluster choices are kept, for a restart while the API is down"},
		}, append(append(provisionFlags(), fetchFlags()...), canaryFlags()...)...), gpuFlags()...), runtimeFlags()...),
		Action: runAgent,
	}
}

func runAgent(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("agent takes no arguments, got %q (wants come from --config or the API)", c.Args().First())
	}
	return inSession(c, needContainerd, func(s *session) error {
		if s.simulated {
			slog.Warn("SIMULATED node facts: probes are simulated; nothing is proved on a GPU", "node", lineageString(c, "node"))
		}
		lopts := provision.LoopOptions{Recheck: c.Duration("recheck"), RetryMin: c.Duration("retry"), NodeCheck: c.Duration("node-check")}
		var started func(*agent.Agent)
		if name := c.String("node-name"); name != "" {
			fn, err := newFleetNode(c, name, s)
			if err != nil {
				return err
			}
			// One node fetches a new digest from upstream, the others
			// then pull it through their mirror (docs/fleet.md).
			cfg, err := fleet.ClientConfig(c.String("kubeconfig"), true)
			if err != nil {
				return err
			}
			gate, err := newFetchGate(c, cfg, name, s)
			if err != nil {
				return err
			}
			if gate != nil {
				s.opts = append(s.opts, provision.WithFetchGate(gate))
			}
			// A new version is proved by one node of each GPU class
			// before the class's others try it: a variant that fails
			// its probe there costs one node's attempt, not the
			// class's.
			cn, err := newCanary(c, cfg, name)
			if err != nil {
				return err
			}
			if cn != nil {
				s.opts = append(s.opts, provision.WithCanary(cn))
			}
			lopts.OnChange = fn.StatusChanged
			// Before the loop's first pass: a restarted agent provisions
			// with the cluster's choices, not the file's.
			started = func(a *agent.Agent) {
				if err := fn.Start(c.Context, a); err != nil {
					slog.Error("fleet layer not started: the node's own overrides hold", "err", err)
				}
			}
		}
		err := agent.Run(c.Context, agent.RunConfig{
			Runtime:   s.rt,
			Provision: s.opts,
			Loop:      lopts,
			Started:   started,
			Options: agent.Options{ConfigPath: c.String("config"), OverridesPath: lineageString(c, "overrides"),
				NFDFeaturesDir: nfdDir(c), SweepEvery: c.Duration("sweep-every")},
			Socket:         c.String("socket"),
			MetricsAddress: c.String("metrics-address"),
		})
		var bad *agent.InputError
		if errors.As(err, &bad) {
			return cli.Exit(err.Error(), exitUsage)
		}
		return err
	})
}

// newFleetNode makes the fleet layer of the agent on Node name.
func newFleetNode(c *cli.Context, name string, s *session) (*fleet.Node, error) {
	cfg, err := fleet.ClientConfig(c.String("kubeconfig"), true)
	if err != nil {
		return nil, err
	}
	return fleet.NewNode(fleet.NodeOptions{Config: cfg, NodeName: name, CachePath: c.String("fleet-cache"), Facts: s.nodes,
		WantsConfigMap: c.String("wants-configmap")})
}

// nfdDir is --nfd-features-dir; its default only where NFD made it, so no
// labels are made up on a host without node-feature-discovery.
func nfdDir(c *cli.Context) string {
	dir := c.String("nfd-features-dir")
	if dir == "" || c.IsSet("nfd-features-dir") {
		return dir
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		slog.Info("no node-feature-discovery features directory: no node labels (give --nfd-features-dir to make one)", "dir", dir)
		return ""
	}
	return dir
}
