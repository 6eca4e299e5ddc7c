package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
)

func init() { register(probeCommand) }

func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      "probe",
		Usage:     "run the compute probe alone against an image already pulled, and print its verdict",
		UsageText: "gpupin probe REF [--probe torch|cuda|exec] [--gpus …] [--json]",
		Description: "For debugging a node: nothing is pinned or changed. REF is an image record in the namespace " +
			"(a pinned repo@sha256:… or any pulled name). The probe runs as a provision runs it, in the same box and " +
			"judged the same way. Exit 0 when the probe passed, 1 otherwise.",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "engine", Usage: "engine name, for the probe's default and the torch probe's engine import"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED: simulated checks)"},
			&cli.BoolFlag{Name: "json", Usage: "print the verdict as JSON"},
		}, provisionFlags()...), append(gpuFlags(), runtimeFlags()...)...),
		Action: runProbe,
	}
}

func runProbe(c *cli.Context) error {
	if c.NArg() != 1 {
		return cli.Exit("usage: gpupin probe REF [--probe KIND]", exitUsage)
	}
	ref := c.Args().First()
	s, err := openSession(c)
	if err != nil {
		return err
	}
	defer s.close()
	f, err := s.nodes.Read(c.Context)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	if !f.Simulated && !f.Supported() {
		return cli.Exit("unsupported: "+f.Unsupported, exitNoResult)
	}
	cfg, err := s.rt.ImageConfig(c.Context, ref, f.Platform)
	if err != nil {
		return cli.Exit(fmt.Sprintf("%v (pull it first: gpupin provision, or ctr -n %s images pull)", err, s.rt.Namespace()), exitError)
	}
	// What the image says of itself, as its labels carry it; --probe and
	// --engine stand in for them.
	meta := images.Metadata{Probe: cfg.Labels[images.AnnotationProbe], ProbeExec: cfg.Labels[images.AnnotationProbeExec]}
	if c.IsSet("probe") {
		meta.Probe = c.String("probe")
	}
	engine := c.String("engine")
	if engine == "" {
		engine = cfg.Labels[images.AnnotationEngine]
	}
	start := time.Now()
	verdict, _, err := s.provisioner().Probe(c.Context, ref, meta, engine, f)
	took := time.Since(start)
	if jsonOut(c) {
		out := map[string]any{"ref": ref, "simulated": f.Simulated, "verdict": verdict, "duration_ms": took.Milliseconds()}
		if err != nil {
			out["error"] = err.Error()
		}
		writeJSON(c.App.Writer, out)
	} else {
		fmt.Fprint(c.App.Writer, simulatedNote(f))
		fmt.Fprintf(c.App.Writer, "probe of %s in %s\n", ref, took.Round(time.Millisecond))
		if verdict != nil {
			for _, d := range verdict.Devices {
				if verdict.Simulated {
					fmt.Fprintf(c.App.Writer, "  gpu %d: %s (cc %s), simulated\n", d.Index, d.Name, d.CC)
					continue
				}
				fmt.Fprintf(c.App.Writer, "  gpu %d: %s (cc %s) %.1f TFLOP/s, max abs err %.3g\n", d.Index, d.Name, d.CC, d.TFLOPS, d.MaxAbsErr)
			}
			for _, check := range verdict.SimulatedChecks {
				fmt.Fprintf(c.App.Writer, "  simulated: %s\n", check)
			}
		}
		switch {
		case err != nil:
			fmt.Fprintln(c.App.Writer, err)
		case verdict != nil && verdict.Simulated:
			fmt.Fprintf(c.App.Writer, "PASSED (SIMULATED: %d checks simulated, the rest checked for real)\n", len(verdict.SimulatedChecks))
		default:
			fmt.Fprintln(c.App.Writer, "PASSED")
		}
	}
	if err != nil {
		return cli.Exit("", exitError)
	}
	return nil
}
