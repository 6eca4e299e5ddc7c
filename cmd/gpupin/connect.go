package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

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

// connect opens containerd as the global flags say.
func connect(c *cli.Context) (*runtime.Runtime, error) {
	opts := []runtime.Opt{
		runtime.WithNamespace(lineageString(c, "namespace")),
		runtime.WithSnapshotter(lineageString(c, "snapshotter")),
		runtime.WithHostsDir(lineageString(c, "hosts-dir")),
		runtime.WithInsecureRegistries(c.StringSlice("insecure-registry")),
	}
	if dirs := c.StringSlice("cdi-spec-dir"); len(dirs) > 0 {
		opts = append(opts, runtime.WithCDISpecDirs(dirs...))
	}
	if r := c.String("runc-root"); r != "" {
		opts = append(opts, runtime.WithRuncRoot(r))
	}
	return runtime.Connect(c.Context, lineageString(c, "address"), opts...)
}

// gpuSpec reads --gpu-mode and --gpus; a simulated node gets no GPU unless
// a mode is asked for.
func gpuSpec(c *cli.Context, simulated bool) (*runtime.GPUs, error) {
	mode := c.String("gpu-mode")
	if mode == "" {
		if simulated {
			mode = string(runtime.GPUNone)
		} else {
			mode = string(runtime.GPUCDI)
		}
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

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t).Round(time.Second)
	return fmt.Sprintf("%s ago", d)
}
