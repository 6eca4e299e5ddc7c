package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

func globalFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "address", Value: containerd.DefaultAddress, EnvVars: []string{"CONTAINERD_ADDRESS"}, Usage: "containerd socket"},
		&cli.StringFlag{Name: "namespace", Value: containerd.DefaultNamespace, EnvVars: []string{"CONTAINERD_NAMESPACE"}, Usage: "containerd namespace (k8s.io under Kubernetes, so kubelet sees the pins)"},
		&cli.StringFlag{Name: "local-prefix", Value: containerd.DefaultLocalPrefix, EnvVars: []string{"GPUPIN_LOCAL_PREFIX"}, Usage: "prefix of each pin's node-local name, `PREFIX`/ENGINE:VERSION, for pods with imagePullPolicy: Never"},
		&cli.StringFlag{Name: "snapshotter", Value: containerd.DefaultSnapshotter, EnvVars: []string{"CONTAINERD_SNAPSHOTTER"}, Usage: "containerd snapshotter"},
		&cli.StringFlag{Name: "hosts-dir", Value: registry.DefaultHostsDir, Usage: "containerd certs.d directory: registry mirrors and TLS"},
		&cli.StringSliceFlag{Name: "insecure-registry", EnvVars: []string{"GPUPIN_INSECURE_REGISTRIES"}, Usage: "registry (host:port) reached over plain HTTP; loopback ones always are"},
		&cli.StringFlag{Name: "node", EnvVars: []string{"GPUPIN_NODE"}, Usage: "read node facts from `FILE` (the JSON `detect --json` prints) instead of NVML; results say they are simulated"},
		&cli.StringFlag{Name: "overrides", Value: images.DefaultOverridesPath, EnvVars: []string{"GPUPIN_OVERRIDES"}, Usage: "overrides file"},
		&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"GPUPIN_LOG_LEVEL"}, Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
	}, registryFlags()...)
}

// runtimeFlags are the flags of commands that talk to containerd and run
// containers.
func runtimeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "cdi-spec-dir", Value: cli.NewStringSlice(containerd.DefaultCDIDirs()...), Usage: "where CDI specs are read"},
		&cli.StringFlag{Name: "runc-root", Usage: "runc's state directory (default: runc's own)", Hidden: true},
		keepLayersFlag(),
	}
}

func keepLayersFlag() cli.Flag {
	return &cli.BoolFlag{Name: "keep-layers", EnvVars: []string{"GPUPIN_KEEP_LAYERS"}, Usage: "store every layer blob gpupin downloads in containerd's content store, as ctr pull does " +
		"(for ctr export, a push from the node, a pull that resumes); by default a layer gpupin extracted itself, and verified, is stored only where " +
		"containerd's hosts configuration (--hosts-dir) names a mirror for its registry, so peers can fetch it from this node: elsewhere the node runs from its snapshots"}
}

func gpuFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "gpu-mode", Usage: "how GPUs reach the container: cdi, nvidia-runtime or none (default cdi; none on a simulated node)"},
		&cli.StringSliceFlag{Name: "gpus", Usage: "GPUs to inject: all, indexes, UUIDs or CDI names (default all)"},
	}
}

// provisionFlags are the flags of commands that provision (provision, agent).
func provisionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "provision-timeout", Value: provision.DefaultTimeout, Usage: "give up on a provision (pulls and probes included) after this long; the status says it was this timeout"},
		&cli.DurationFlag{Name: "probe-timeout", Value: provision.DefaultProbeTimeout, Usage: "kill a probe that runs longer"},
		&cli.StringFlag{Name: "probe-memory", Value: formatBytes(provision.DefaultProbeMemory), Usage: "the probe container's memory limit, swap included (bytes, or k, m, g, t); the probe always has one, so 0 is refused"},
		&cli.Int64Flag{Name: "probe-pids", Value: provision.DefaultProbePids, Usage: "the probe container's pids limit; the probe always has one, so 0 is refused"},
		&cli.StringFlag{Name: "probe", Usage: "probe to use when neither the image nor the engine names one: torch, cuda, exec"},
		&cli.StringFlag{Name: "probe-dir", Usage: "where probe programs are staged on the host"},
		&cli.StringFlag{Name: "cuda-probe", Usage: "path of the gpupin-cuda-probe binary"},
		&cli.StringFlag{Name: "sim-probe", Usage: "path of the gpupin-sim-probe binary (the emulator test fixtures ask for)"},
		&cli.StringFlag{Name: "prefetch-fallback", Usage: "while a candidate is probed, fetch and unpack the next one if its layers are at most this size (bytes, or k, m, g, t), so a failed probe costs no second pull; off by default: it spends bandwidth and disk that a passing probe never uses"},
		&cli.StringFlag{Name: "lock-dir", Value: provision.DefaultLockDir, Usage: "per-engine locks shared with the agent and other gpupin processes"},
		trustPolicyFlag(),
	}
}

// trustPolicyFlag names the signature policy (package trust): provision,
// the agent and plan read it; without it nothing is required.
func trustPolicyFlag() cli.Flag {
	return &cli.StringFlag{Name: "trust-policy", EnvVars: []string{"GPUPIN_TRUST_POLICY"}, Usage: "signature policy `FILE` (YAML or JSON): per engine, mode required|off and the cosign keys or keyless identities that must have signed; verified before the pull (default: off)"}
}

// registryFlags bound what a registry may withhold; global, as every
// command that reads a registry honours them.
func registryFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "registry-timeout", Value: registry.DefaultHeaderTimeout, EnvVars: []string{"GPUPIN_REGISTRY_TIMEOUT"}, Usage: "give up on a registry request that has no answer (response headers) after this long"},
		&cli.DurationFlag{Name: "registry-stall", Value: registry.DefaultStallTimeout, EnvVars: []string{"GPUPIN_REGISTRY_STALL"}, Usage: "cut a transfer that moved less than 32 KiB in this long"},
	}
}

func setupLogging(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return cli.Exit(fmt.Sprintf("--log-level %q: want debug, info, warn or error", c.String("log-level")), exitUsage)
	}
	// GPUPIN_UNPACK_TRACE (docs/benchmarks.md) asks for the pull's trace of
	// each layer, which the pull logs at debug level.
	if os.Getenv("GPUPIN_UNPACK_TRACE") != "" && level > slog.LevelDebug {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if c.String("log-format") == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	slog.SetDefault(slog.New(h))
	return nil
}

// jsonOut reports whether --json was given, at any level.
func jsonOut(c *cli.Context) bool {
	for _, ctx := range c.Lineage() {
		if ctx.Bool("json") {
			return true
		}
	}
	return false
}

// writeJSON prints indented JSON to w (the app's writer, so tests capture it).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	return nil
}

// lineageString returns a flag's value from the nearest command that set it
// (a subcommand's own --node, or the global one), else the global default.
// c.String alone would return a subcommand flag's empty default and hide the
// global flag.
func lineageString(c *cli.Context, name string) string {
	return fromLineage(c, name, (*cli.Context).String, func(v string) bool { return v != "" })
}

// lineageSlice is lineageString for a string slice flag.
func lineageSlice(c *cli.Context, name string) []string {
	return fromLineage(c, name, (*cli.Context).StringSlice, func(v []string) bool { return v != nil })
}

// lineageDuration is lineageString for a duration flag.
func lineageDuration(c *cli.Context, name string) time.Duration {
	return fromLineage(c, name, (*cli.Context).Duration, func(v time.Duration) bool { return v != 0 })
}

func fromLineage[T any](c *cli.Context, name string, get func(*cli.Context, string) T, given func(T) bool) T {
	lineage := c.Lineage()
	for _, x := range lineage {
		if x.IsSet(name) {
			return get(x, name)
		}
	}
	// The default: the outermost context that has the flag. (urfave/cli
	// puts a bare context above the app's, which has no flags at all.)
	for i := len(lineage) - 1; i >= 0; i-- {
		if v := get(lineage[i], name); given(v) {
			return v
		}
	}
	var zero T
	return zero
}

func simulatedNote(f *node.Facts) string {
	if f != nil && f.Simulated {
		return "SIMULATED node facts (from --node): no GPU was read; nothing here was proved on hardware\n"
	}
	return ""
}
