package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(provisionCommand) }

func provisionCommand() *cli.Command {
	return &cli.Command{
		Name:      "provision",
		Usage:     "choose, pull, prove and pin each REF for this node",
		UsageText: "gpupin provision REF... [--override V] [--node FILE] [--json]",
		Description: "A pin proved on this node's driver and GPUs is used as it is, without the registry. " +
			"Otherwise the candidates are pulled by digest and probed in turn (auto falls back to the next); " +
			"the first that passes is pinned, and an earlier pin is replaced only then. " +
			"`gpupin plan REF` shows exactly this decision beforehand. " +
			"Exit 0 when every REF is ready, 3 when one is disabled or the node unsupported, 1 when one failed.",
		Flags: append(append(append([]cli.Flag{
			&cli.StringFlag{Name: "override", Usage: "auto, none, a variant name or an image reference, instead of the overrides file"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			&cli.BoolFlag{Name: "json", Usage: "print the statuses as JSON"},
		}, provisionFlags()...), gpuFlags()...), runtimeFlags()...),
		Action: runProvision,
	}
}

func runProvision(c *cli.Context) error {
	if c.NArg() == 0 {
		return usageError("usage: gpupin provision REF... [--override V]")
	}
	wants := make([]provision.Want, c.NArg())
	for i, r := range c.Args().Slice() {
		var err error
		if wants[i], err = want(c, r); err != nil {
			return err
		}
	}
	return inSession(c, needContainerd, func(s *session) error {
		var show []provision.Option
		if !jsonOut(c) {
			show = append(show, provision.WithProgress(newProgressPrinter(os.Stderr).report), provision.WithOnState(func(st provision.Status) {
				if st.State == provision.Probing {
					fmt.Fprintf(os.Stderr, "%s: %s\n", st.Key, st.Detail)
				}
			}))
		}
		p, err := s.provisioner(show...)
		if err != nil {
			return err
		}
		sts := p.Converge(c.Context, wants)
		if jsonOut(c) {
			if err := writeJSON(c.App.Writer, sts); err != nil {
				return err
			}
		} else {
			if s.simulated {
				fmt.Fprint(c.App.Writer, "SIMULATED node facts (from --node): probes were simulated; nothing here was proved on a GPU\n")
			}
			for _, st := range sts {
				writeStatus(c.App.Writer, st)
			}
		}
		return exitFor(sts)
	})
}

func exitFor(sts []provision.Status) error {
	code := exitOK
	for _, st := range sts {
		switch st.State {
		case provision.Failed:
			code = exitError
		case provision.Disabled, provision.Unsupported:
			if code == exitOK {
				code = exitNoResult
			}
		}
	}
	if code != exitOK {
		return cli.Exit("", code)
	}
	return nil
}

func writeStatus(w io.Writer, st provision.Status) {
	fmt.Fprintf(w, "%s: %s\n", st.Key, strings.ToUpper(string(st.State)))
	if st.Pinned != "" {
		fmt.Fprintf(w, "  pinned:   %s (%s)\n", st.Pinned, st.Variant)
	}
	fmt.Fprintf(w, "  detail:   %s\n", st.Detail)
	for _, a := range st.Attempts {
		fmt.Fprintf(w, "  tried:    %s\n", a)
	}
	for _, r := range st.Rejected {
		fmt.Fprintf(w, "  rejected: %s: %s\n", r.Variant, r.Reason)
	}
	writeVerdict(w, "    ", st.Verdict)
}

// writeVerdict prints each device a verdict reports (pad aligns it with
// the lines above), and the checks it simulated.
func writeVerdict(w io.Writer, pad string, v *probe.Verdict) {
	if v == nil {
		return
	}
	for _, d := range v.Devices {
		fmt.Fprintf(w, "  gpu %d:%s", d.Index, pad)
		if v.Simulated {
			fmt.Fprintf(w, "%s (cc %s), simulated\n", d.Name, d.CC)
			continue
		}
		fmt.Fprintf(w, "%s (cc %s) %.1f TFLOP/s, max abs err %.3g\n", d.Name, d.CC, d.TFLOPS, d.MaxAbsErr)
	}
	for _, check := range v.SimulatedChecks {
		fmt.Fprintf(w, "  simulated: %s\n", check)
	}
}
