package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/runtime"
)

func init() {
	register(pinsCommand)
	register(unpinCommand)
	register(gcCommand)
}

// pinView is a pin with whether it still holds on this node.
type pinView struct {
	runtime.Pin
	// Valid is true when the pin was proved under this node's fingerprint.
	Valid *bool `json:"valid,omitempty"`
	// SimulatedChecks are the checks its verdict says were simulated.
	SimulatedChecks []string `json:"simulated_checks,omitempty"`
	// VerdictTruncated: the verdict label was cut, and what it said of
	// simulated checks is lost (VerdictError says so).
	VerdictTruncated bool   `json:"verdict_truncated,omitempty"`
	VerdictError     string `json:"verdict_error,omitempty"`
}

func pinsCommand() *cli.Command {
	return &cli.Command{
		Name:      "pins",
		UsageText: "gpupin pins [--previous] [--node FILE] [--json]",
		Usage:     "list the pinned images, their node-local names, and whether each was proved on this node as it is now",
		Description: "Each pin has a node-local name (--local-prefix, default gpupin.local/ENGINE:VERSION) for pods with " +
			"imagePullPolicy: Never. A pin that another client of containerd relabelled (a pull of the same reference) " +
			"or deleted (kubelet's image GC on containerd 1.6, crictl rmi --prune) is restored first, while its content " +
			"remains; RESTORED says when.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "previous", Usage: "also list the previous pins kept for rollback"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return cli.Exit(fmt.Sprintf("usage: %s (no arguments; got %q)", c.Command.UsageText, c.Args().First()), exitUsage)
			}
			rt, err := connect(c, registryPolicy(c))
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			defer rt.Close()
			pins, err := rt.Pins(c.Context)
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			if c.Bool("previous") {
				prev, err := rt.PreviousPins(c.Context)
				if err != nil {
					return cli.Exit(err.Error(), exitError)
				}
				pins = append(pins, prev...)
			}
			// The node is read only to say whether each pin still holds.
			fp := ""
			if f, err := choiceNode(c); err == nil && f.Supported() {
				fp = f.Fingerprint()
			}
			views := make([]pinView, len(pins))
			for i, p := range pins {
				views[i].Pin = p
				// The label's format is provision's: read it there.
				v, err := provision.ReadPinVerdict(p.Verdict)
				views[i].SimulatedChecks = v.SimulatedChecks
				if err != nil {
					views[i].VerdictTruncated = errors.Is(err, provision.ErrVerdictTruncated)
					views[i].VerdictError = err.Error()
				}
				if fp != "" {
					v := p.Node == fp
					views[i].Valid = &v
				}
			}
			if jsonOut(c) {
				return writeJSON(c.App.Writer, views)
			}
			if len(views) == 0 {
				fmt.Fprintln(c.App.Writer, "no pins in namespace", rt.Namespace())
				return nil
			}
			tw := tabwriter.NewWriter(c.App.Writer, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ENGINE\tVARIANT\tPINNED\tLOCAL NAME\tPROBED\tTHIS NODE")
			for _, v := range views {
				key := v.Key
				if v.Previous {
					key += " (previous)"
				}
				valid := "unknown"
				if v.Valid != nil && *v.Valid {
					valid = "proved"
				} else if v.Valid != nil {
					valid = "re-prove (driver or GPUs changed)"
				}
				if v.Simulated {
					valid += ", SIMULATED"
					switch n := len(v.SimulatedChecks); {
					case v.VerdictError != "":
						valid += " (" + v.VerdictError + ")"
					case n > 0:
						valid += fmt.Sprintf(" (%d checks simulated: %s)", n, strings.Join(v.SimulatedChecks, "; "))
					}
				} else if v.VerdictError != "" {
					valid += " (" + v.VerdictError + ")"
				}
				if !v.Restored.IsZero() {
					valid += ", restored " + v.Restored.Format(time.RFC3339)
				}
				if v.Tampered {
					valid = "TAMPERED: points elsewhere; never run; gpupin gc removes it"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", key, v.Variant, v.Ref, orDefault(v.Local, "-"), v.ProbedAt.Format(time.RFC3339), valid)
			}
			return tw.Flush()
		},
	}
}

func unpinCommand() *cli.Command {
	return &cli.Command{
		Name:      "unpin",
		Usage:     "remove the pin of ENGINE:VERSION and its node-local name (the image stays, as the previous pin, until gc)",
		UsageText: "gpupin unpin ENGINE:VERSION [--json]",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("usage: gpupin unpin ENGINE:VERSION", exitUsage)
			}
			rt, err := connect(c, registryPolicy(c))
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			defer rt.Close()
			p, err := rt.Unpin(c.Context, c.Args().First())
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			if jsonOut(c) {
				return writeJSON(c.App.Writer, p)
			}
			fmt.Fprintf(c.App.Writer, "unpinned %s (%s), and removed its local name; run gpupin gc to remove the image\n", p.Key, p.Ref)
			return nil
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
				return cli.Exit(fmt.Sprintf("usage: %s (no arguments; got %q)", c.Command.UsageText, c.Args().First()), exitUsage)
			}
			rt, err := connect(c, registryPolicy(c))
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			defer rt.Close()
			swept, err := rt.Sweep(c.Context)
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			col, err := rt.GC(c.Context, c.Bool("all"))
			if err != nil {
				return cli.Exit(err.Error(), exitError)
			}
			if jsonOut(c) {
				return writeJSON(c.App.Writer, map[string]any{"swept": swept, "removed": col.Removed, "released": col.Released, "kept": col.Kept})
			}
			fmt.Fprintf(c.App.Writer, "swept %d containers, %d leases, %d candidates left by interrupted runs\n", swept.Containers, swept.Leases, swept.Candidates)
			for _, r := range col.Removed {
				fmt.Fprintln(c.App.Writer, "removed", r)
			}
			for _, r := range col.Released {
				fmt.Fprintln(c.App.Writer, "released", r, "(not made by gpupin: its labels are off, the image stays)")
			}
			fmt.Fprintf(c.App.Writer, "kept %d images\n", len(col.Kept))
			return nil
		},
	}
}
