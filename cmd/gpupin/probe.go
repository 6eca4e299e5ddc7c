package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/runtime"
)

const defaultProbeTimeout = 10 * time.Minute

func init() { register(probeCommand()) }

func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      "probe",
		Usage:     "run the compute probe alone against an image already pulled, and print its verdict",
		UsageText: "gpupin probe REF [--probe torch|cuda|exec] [--gpus …] [--json]",
		Description: "For debugging a node: nothing is pinned or changed. REF is an image record in the namespace " +
			"(a pinned repo@sha256:… or any pulled name). Exit 0 when the probe passed, 1 otherwise.",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "probe", Usage: "torch, cuda or exec (default: the image's io.gpupin.probe, else by engine)"},
			&cli.StringFlag{Name: "engine", Usage: "engine name, for the probe's default and the torch probe's engine import"},
			&cli.DurationFlag{Name: "timeout", Value: defaultProbeTimeout, Usage: "kill the probe after this long"},
			&cli.StringFlag{Name: "probe-dir", Usage: "where probe programs are staged on the host"},
			&cli.StringFlag{Name: "cuda-probe", Usage: "path of the gpupin-cuda-probe binary"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED: runs the simulated probe)"},
			&cli.BoolFlag{Name: "json", Usage: "print the verdict as JSON"},
		}, gpuFlags()...), runtimeFlags()...),
		Action: runProbe,
	}
}

func runProbe(c *cli.Context) error {
	if c.NArg() != 1 {
		return cli.Exit("usage: gpupin probe REF [--probe KIND]", exitUsage)
	}
	ref := c.Args().First()
	rt, err := connect(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	defer rt.Close()
	f, err := readNode(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	cfg, err := rt.ImageConfig(c.Context, ref, f.Platform)
	if err != nil {
		return cli.Exit(fmt.Sprintf("%v (pull it first: gpupin provision, or ctr -n %s images pull)", err, rt.Namespace()), exitError)
	}
	engine := c.String("engine")
	if engine == "" {
		engine = cfg.Labels[images.AnnotationEngine]
	}
	annotation := cfg.Labels[images.AnnotationProbe]
	if c.IsSet("probe") {
		annotation = c.String("probe")
	}
	kind, err := probe.Select(annotation, engine, "")
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	opts := probe.Options{Dir: c.String("probe-dir"), CUDAProbeBinary: c.String("cuda-probe"), Engine: engine}
	if opts.Dir == "" {
		opts.Dir = os.TempDir() + "/gpupin-probe"
	}
	if f.Simulated {
		kind = probe.Sim
		for _, g := range f.GPUs {
			opts.Sim.Devices = append(opts.Sim.Devices, probe.Device{Index: g.Index, UUID: g.UUID, Name: g.Name, CC: g.CC})
		}
		opts.Sim.NodeCUDA = f.CUDA
	} else if !f.Supported() {
		return cli.Exit("unsupported: "+f.Unsupported, exitNoResult)
	}
	if kind == probe.Exec {
		if opts.ExecArgv, err = probe.ParseExecLabel(cfg.Labels[images.AnnotationProbeExec]); err != nil {
			return cli.Exit(err.Error(), exitError)
		}
	}
	prog, err := probe.Build(kind, opts)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	gpus, err := gpuSpec(c, f.Simulated)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	var mounts []runtime.Mount
	for _, m := range prog.Mounts {
		mounts = append(mounts, runtime.Mount{Source: m.Source, Destination: m.Destination})
	}
	res, err := rt.Run(c.Context, runtime.RunSpec{Image: ref, Args: prog.Args, Env: prog.Env, Mounts: mounts, GPUs: *gpus,
		Hardened: true, Role: "probe", MemoryLimit: 16 << 30, PidsLimit: 4096, Timeout: c.Duration("timeout")})
	var verdict *probe.Verdict
	if err == nil {
		verdict, err = probe.Parse(res.Output, res.ExitCode)
	} else if errors.Is(err, runtime.ErrTimeout) {
		err = probe.NewFailure(fmt.Sprintf("%s probe did not finish in %s and was killed", kind, c.Duration("timeout")), res.Output)
	}
	if verdict != nil {
		verdict.Simulated = f.Simulated
	}
	if jsonOut(c) {
		out := map[string]any{"ref": ref, "probe": kind, "simulated": f.Simulated, "verdict": verdict, "exit_code": res.ExitCode, "duration_ms": res.Duration.Milliseconds()}
		if err != nil {
			out["error"] = err.Error()
		}
		writeJSON(c.App.Writer, out)
	} else {
		fmt.Fprint(c.App.Writer, simulatedNote(f))
		fmt.Fprintf(c.App.Writer, "%s probe of %s: exit %d in %s\n", kind, ref, res.ExitCode, res.Duration.Round(time.Millisecond))
		if verdict != nil {
			for _, d := range verdict.Devices {
				fmt.Fprintf(c.App.Writer, "  gpu %d: %s (cc %s) %.1f TFLOP/s, max abs err %.3g\n", d.Index, d.Name, d.CC, d.TFLOPS, d.MaxAbsErr)
			}
		}
		if err != nil {
			fmt.Fprintln(c.App.Writer, err)
		} else {
			fmt.Fprintln(c.App.Writer, "PASSED")
		}
	}
	if err != nil {
		return cli.Exit("", exitError)
	}
	return nil
}
