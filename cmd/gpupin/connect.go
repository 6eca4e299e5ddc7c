package main

import (
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/runtime"
)

// runtimeFlags are the flags of commands that talk to containerd and run
// containers.
func runtimeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "cdi-spec-dir", Value: cli.NewStringSlice("/etc/cdi", "/var/run/cdi"), Usage: "where CDI specs are read"},
		&cli.StringFlag{Name: "runc-root", Usage: "runc's state directory (default: runc's own)", Hidden: true},
	}
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
		&cli.DurationFlag{Name: "provision-timeout", Value: time.Hour, Usage: "give up on a provision (pulls and probes included) after this long; the status says it was this timeout"},
		&cli.DurationFlag{Name: "probe-timeout", Value: 10 * time.Minute, Usage: "kill a probe that runs longer"},
		&cli.StringFlag{Name: "probe-memory", Value: "16g", Usage: "the probe container's memory limit, swap included (bytes, or k, m, g, t); the probe always has one, so 0 is refused"},
		&cli.Int64Flag{Name: "probe-pids", Value: 4096, Usage: "the probe container's pids limit; the probe always has one, so 0 is refused"},
		&cli.StringFlag{Name: "probe", Usage: "probe to use when neither the image nor the engine names one: torch, cuda, exec"},
		&cli.StringFlag{Name: "probe-dir", Usage: "where probe programs are staged on the host"},
		&cli.StringFlag{Name: "cuda-probe", Usage: "path of the gpupin-cuda-probe binary"},
		&cli.StringFlag{Name: "sim-probe", Usage: "path of the gpupin-sim-probe binary (the emulator test fixtures ask for)"},
		&cli.StringFlag{Name: "lock-dir", Value: "/run/gpupin/locks", Usage: "per-engine locks shared with the agent and other gpupin processes"},
	}
}

// registryFlags bound what a registry may withhold; global, as every
// command that reads a registry honours them.
func registryFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "registry-timeout", Value: registry.DefaultHeaderTimeout, EnvVars: []string{"GPUPIN_REGISTRY_TIMEOUT"}, Usage: "give up on a registry request that has no answer (response headers) after this long"},
		&cli.DurationFlag{Name: "registry-stall", Value: registry.DefaultStallTimeout, EnvVars: []string{"GPUPIN_REGISTRY_STALL"}, Usage: "cut a transfer that moved less than 32 KiB in this long"},
	}
}

// gpuSpec reads --gpu-mode and --gpus; nil when neither is given, so the
// library's default holds (every GPU through CDI; none on a simulated node).
func gpuSpec(c *cli.Context) (*runtime.GPUs, error) {
	if !hasFlag(c, "gpu-mode") || (!c.IsSet("gpu-mode") && !c.IsSet("gpus")) {
		return nil, nil
	}
	mode := c.String("gpu-mode")
	if mode == "" {
		mode = string(runtime.GPUCDI)
	}
	m, err := runtime.ParseGPUMode(mode)
	if err != nil {
		return nil, err
	}
	g := &runtime.GPUs{Mode: m}
	switch m {
	case runtime.GPUCDI:
		g.Devices = runtime.ExpandGPUs(c.StringSlice("gpus"))
	case runtime.GPUNvidiaRuntime:
		g.Devices = c.StringSlice("gpus")
	}
	return g, nil
}
