package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/node"
)

func globalFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "address", Value: "/run/containerd/containerd.sock", EnvVars: []string{"CONTAINERD_ADDRESS"}, Usage: "containerd socket"},
		&cli.StringFlag{Name: "namespace", Value: "gpupin", EnvVars: []string{"CONTAINERD_NAMESPACE"}, Usage: "containerd namespace (k8s.io under Kubernetes, so kubelet sees the pins)"},
		&cli.StringFlag{Name: "local-prefix", Value: "gpupin.local", EnvVars: []string{"GPUPIN_LOCAL_PREFIX"}, Usage: "prefix of each pin's node-local name, `PREFIX`/ENGINE:VERSION, for pods with imagePullPolicy: Never"},
		&cli.StringFlag{Name: "snapshotter", Value: "overlayfs", EnvVars: []string{"CONTAINERD_SNAPSHOTTER"}, Usage: "containerd snapshotter"},
		&cli.StringFlag{Name: "hosts-dir", Value: "/etc/containerd/certs.d", Usage: "containerd certs.d directory: registry mirrors and TLS"},
		&cli.StringSliceFlag{Name: "insecure-registry", EnvVars: []string{"GPUPIN_INSECURE_REGISTRIES"}, Usage: "registry (host:port) reached over plain HTTP; loopback ones always are"},
		&cli.StringFlag{Name: "node", EnvVars: []string{"GPUPIN_NODE"}, Usage: "read node facts from `FILE` (the JSON `detect --json` prints) instead of NVML; results say they are simulated"},
		&cli.StringFlag{Name: "overrides", Value: "/etc/gpupin/overrides.yaml", EnvVars: []string{"GPUPIN_OVERRIDES"}, Usage: "overrides file"},
		&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"GPUPIN_LOG_LEVEL"}, Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
	}, registryFlags()...)
}

func setupLogging(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return cli.Exit(fmt.Sprintf("--log-level %q: want debug, info, warn or error", c.String("log-level")), exitUsage)
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

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// lineageSlice is lineageString for a string slice flag.
func lineageSlice(c *cli.Context, name string) []string {
	lineage := c.Lineage()
	for _, x := range lineage {
		if x.IsSet(name) {
			return x.StringSlice(name)
		}
	}
	for i := len(lineage) - 1; i >= 0; i-- { // the default (see lineageString)
		if v := lineage[i].StringSlice(name); v != nil {
			return v
		}
	}
	return nil
}

// lineageDuration is lineageString for a duration flag.
func lineageDuration(c *cli.Context, name string) time.Duration {
	lineage := c.Lineage()
	for _, x := range lineage {
		if x.IsSet(name) {
			return x.Duration(name)
		}
	}
	for i := len(lineage) - 1; i >= 0; i-- { // the default (see lineageString)
		if v := lineage[i].Duration(name); v != 0 {
			return v
		}
	}
	return 0
}

func simulatedNote(f *node.Facts) string {
	if f != nil && f.Simulated {
		return "SIMULATED node facts (from --node): no GPU was read; nothing here was proved on hardware\n"
	}
	return ""
}
