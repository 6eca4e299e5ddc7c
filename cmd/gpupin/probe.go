package main

import (
	"errors"
	"fmt"
	"io"
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
		return usageError("usage: gpupin probe REF [--probe KIND]")
	}
	ref := c.Args().First()
	as := provision.ProbeAs{Engine: c.String("engine")}
	if c.IsSet("probe") {
		as.Probe = c.String("probe")
	}
	return inSession(c, needContainerd, func(s *session) error {
		p, err := s.provisioner()
		if err != nil {
			return err
		}
		r, err := p.ProbeImage(c.Context, ref, as)
		if errors.Is(err, provision.ErrNotPulled) {
			return fmt.Errorf("%w (pull it first: gpupin provision, or ctr -n %s images pull)", err, s.rt.Namespace())
		}
		if r == nil {
			return err
		}
		if jsonOut(c) {
			out := map[string]any{"ref": ref, "simulated": r.Target.Node.Simulated, "target": r.Target, "verdict": r.Verdict, "duration_ms": r.Duration.Milliseconds()}
			if err != nil {
				out["error"] = err.Error()
			}
			if werr := writeJSON(c.App.Writer, out); werr != nil {
				return werr
			}
		} else {
			writeProbe(c.App.Writer, r, err)
		}
		if err != nil {
			return cli.Exit("", exitError)
		}
		return nil
	})
}

// writeProbe prints a probe's report for a person.
func writeProbe(w io.Writer, r *provision.ProbeReport, err error) {
	t := r.Target
	fmt.Fprint(w, simulatedNote(t.Node))
	fmt.Fprintf(w, "probe of %s in %s\n", r.Image, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(w, "  probe:  %s (engine %s, named by the %s; metadata from %s)\n", t.Probe, t.Engine, t.NamedBy, t.From)
	writeVerdict(w, " ", r.Verdict)
	switch {
	case err != nil:
		fmt.Fprintln(w, err)
	case r.Verdict.Simulated:
		fmt.Fprintf(w, "PASSED (SIMULATED: %d checks simulated, the rest checked for real)\n", len(r.Verdict.SimulatedChecks))
	default:
		fmt.Fprintln(w, "PASSED")
	}
}
