package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/provision"
)

func init() { register(probeCommand) }

func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      "probe",
		Usage:     "run the compute probe alone against an image already pulled, and print its verdict",
		UsageText: "gpupin probe REF [--probe torch|cuda|exec] [--gpus …] [--json]",
		Description: "For debugging a node: nothing is pinned or changed. REF is an image record in the namespace " +
			"(a pinned repo@sha256:…, its local name, or any pulled name). The image is read as a provision reads it: " +
			"its metadata from the registry (a pin's from the source it was made from, index annotations included), " +
			"its engine named by io.gpupin.engine, else the repository's last element, and so the same probe; when the " +
			"registry does not answer, the image's own config stands in. The probe runs as a provision runs it, in the " +
			"same box and judged the same way. Exit 0 when the probe passed, 1 otherwise.",
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
	p := s.provisioner()
	as := provision.ProbeAs{Engine: c.String("engine")}
	if c.IsSet("probe") {
		as.Probe = c.String("probe")
	}
	// The image as a provision reads it: its engine, its metadata (from the
	// registry, a pin's source, or its own config), and so its probe.
	t, err := p.ProbeTarget(c.Context, ref, as)
	switch {
	case errors.Is(err, provision.ErrInvalidWant):
		return cli.Exit(err.Error(), exitUsage)
	case errors.Is(err, provision.ErrUnsupported):
		return cli.Exit(err.Error(), exitNoResult)
	case errors.Is(err, provision.ErrNotPulled):
		return cli.Exit(fmt.Sprintf("%v (pull it first: gpupin provision, or ctr -n %s images pull)", err, s.rt.Namespace()), exitError)
	case err != nil:
		return cli.Exit(err.Error(), exitError)
	}
	start := time.Now()
	verdict, _, err := p.Probe(c.Context, ref, t.Meta, t.Engine, t.Node)
	took := time.Since(start)
	if jsonOut(c) {
		out := map[string]any{"ref": ref, "simulated": t.Node.Simulated, "target": t, "verdict": verdict, "duration_ms": took.Milliseconds()}
		if err != nil {
			out["error"] = err.Error()
		}
		writeJSON(c.App.Writer, out)
	} else {
		fmt.Fprint(c.App.Writer, simulatedNote(t.Node))
		fmt.Fprintf(c.App.Writer, "probe of %s in %s\n", ref, took.Round(time.Millisecond))
		fmt.Fprintf(c.App.Writer, "  probe:  %s (engine %s, named by the %s; metadata from %s)\n", t.Probe, t.Engine, t.NamedBy, t.From)
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
