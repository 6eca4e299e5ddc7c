package main

import (
	"cmp"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/provision"
)

func init() {
	register(pinsCommand)
	register(unpinCommand)
	register(gcCommand)
}

func pinsCommand() *cli.Command {
	return &cli.Command{
		Name:      "pins",
		UsageText: "gpupin pins [--previous] [--node FILE] [--json]",
		Usage:     "list the pinned images, their node-local names, and whether each was proved on this node as it is now",
		Description: "Each pin has a node-local name (--local-prefix, default gpupin.local/ENGINE:VERSION) for pods with " +
			"imagePullPolicy: Never. The listing only reads: a pin that another client of containerd relabelled (a pull of " +
			"the same reference) or deleted (kubelet's image GC on containerd 1.6, crictl rmi --prune) shows as containerd " +
			"holds it until the next provision, run, gc or agent pass restores it, while its content remains; RESTORED says " +
			"when one was.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "previous", Usage: "also list the previous pins kept for rollback"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: runPins,
	}
}

func runPins(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("usage: %s (no arguments; got %q)", c.Command.UsageText, c.Args().First())
	}
	return inSession(c, needContainerd, func(s *session) error {
		p, err := s.provisioner()
		if err != nil {
			return err
		}
		pins, err := p.Pins(c.Context, c.Bool("previous"))
		if err != nil {
			return err
		}
		if jsonOut(c) {
			return writeJSON(c.App.Writer, pins)
		}
		if len(pins) == 0 {
			fmt.Fprintln(c.App.Writer, "no pins in namespace", s.rt.Namespace())
			return nil
		}
		tw := tabwriter.NewWriter(c.App.Writer, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ENGINE\tVARIANT\tPINNED\tLOCAL NAME\tPROBED\tSIGNED BY\tTHIS NODE")
		for _, p := range pins {
			key := p.Key
			if p.Previous {
				key += " (previous)"
			}
			signed := "-"
			if p.Signed != nil {
				signed = p.Signed.By
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", key, p.Variant, p.Ref, cmp.Or(p.Local, "-"), p.ProbedAt.Format(time.RFC3339), signed, pinState(p))
		}
		return tw.Flush()
	})
}

// pinState says whether a pin holds on this node, and how it was proved.
func pinState(p provision.PinStatus) string {
	if p.Tampered {
		return "TAMPERED: points elsewhere; never run; gpupin gc removes it"
	}
	state := "unknown"
	if p.Valid != nil && *p.Valid {
		state = "proved"
	} else if p.Valid != nil {
		state = "re-prove (driver or GPUs changed)"
	}
	if p.Simulated {
		state += ", SIMULATED"
	}
	switch {
	case p.VerdictError != "":
		state += " (" + p.VerdictError + ")"
	case p.Simulated && len(p.SimulatedChecks) > 0:
		state += fmt.Sprintf(" (%d checks simulated: %s)", len(p.SimulatedChecks), strings.Join(p.SimulatedChecks, "; "))
	}
	if !p.Restored.IsZero() {
		state += ", restored " + p.Restored.Format(time.RFC3339)
	}
	return state
}

func unpinCommand() *cli.Command {
	return &cli.Command{
		Name:      "unpin",
		Usage:     "remove the pin of ENGINE:VERSION and its node-local name (the image stays, as the previous pin, until gc)",
		UsageText: "gpupin unpin ENGINE:VERSION [--json]",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("usage: gpupin unpin ENGINE:VERSION")
			}
			return inSession(c, needContainerd, func(s *session) error {
				p, err := s.rt.Unpin(c.Context, c.Args().First())
				if err != nil {
					return err
				}
				if jsonOut(c) {
					return writeJSON(c.App.Writer, p)
				}
				fmt.Fprintf(c.App.Writer, "unpinned %s (%s), and removed its local name; run gpupin gc to remove the image\n", p.Key, p.Ref)
				return nil
			})
		},
	}
}

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:      "gc",
		UsageText: "gpupin gc [--all] [--json]",
		Usage:     "remove gpupin's images that no pin and no container uses, and what an interrupted run left",
		Description: "Pins another client took are restored first; local names stay while they point at their pin, and " +
			"those of keys without a pin go.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Usage: "remove the previous pins kept for rollback too"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usageError("usage: %s (no arguments; got %q)", c.Command.UsageText, c.Args().First())
			}
			return inSession(c, needContainerd, func(s *session) error {
				col, err := s.rt.GC(c.Context, c.Bool("all"))
				if err != nil {
					return err
				}
				if jsonOut(c) {
					return writeJSON(c.App.Writer, col)
				}
				w := c.App.Writer
				fmt.Fprintf(w, "swept %d containers, %d leases, %d candidates left by interrupted runs\n", col.Swept.Containers, col.Swept.Leases, col.Swept.Candidates)
				for _, r := range col.Removed {
					fmt.Fprintln(w, "removed", r)
				}
				for _, r := range col.Released {
					fmt.Fprintln(w, "released", r, "(not made by gpupin: its labels are off, the image stays)")
				}
				fmt.Fprintf(w, "kept %d images\n", len(col.Kept))
				return nil
			})
		},
	}
}
