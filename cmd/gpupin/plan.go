package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(planCommand) }

func planCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "show what provisioning REF would do on this node, and why (reads manifests only, pulls nothing)",
		UsageText: "gpupin plan REF [--override auto|none|VARIANT|IMAGE] [--node FILE] [--json]",
		Description: "The same decision `gpupin provision` and the agent make: the engine is named by the " +
			"io.gpupin.engine annotation, else the repository's last path element; its override comes from --override, " +
			"else the overrides file under that name. A pin proved on this node answers without the registry, as it " +
			"would for provision (with --node, pins are not read: the facts are another machine's). " +
			"Exit 0 when a candidate or a pin exists, 3 when none fits, the override is none or the node is " +
			"unsupported, 1 on error or when provisioning would be refused (a pin held from another source), 2 on usage.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "override", Usage: "auto, none, a variant name or an image reference, instead of the overrides file"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			&cli.BoolFlag{Name: "json", Usage: "print the plan as JSON"},
			&cli.StringFlag{Name: "node-name", Usage: "also read the cluster's EngineOverrides for the Kubernetes Node `NAME`, as its agent does (node > group > cluster > the overrides file)"},
			kubeconfigFlag(),
			trustPolicyFlag(),
		},
		Action: runPlan,
	}
}

func runPlan(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageError("usage: gpupin plan REF [--override V] [--node FILE] [--json]")
	}
	w, err := want(c, c.Args().First())
	if err != nil {
		return err
	}
	// The node's pins count as they do for provision; another machine's
	// facts (--node) have none here. No containerd is no pins, not an
	// error: plan also answers on a machine that only looks.
	use := tryContainerd
	if lineageString(c, "node") != "" {
		use = noContainerd
	}
	return inSession(c, use, func(s *session) error {
		var extra []provision.Option
		var cluster *clusterOverrides
		if name := c.String("node-name"); name != "" {
			if cluster, err = readClusterOverrides(c, name); err != nil {
				return err
			}
			extra = append(extra, provision.WithOverrides(cluster))
		}
		p, err := s.provisioner(extra...)
		if err != nil {
			return err
		}
		pl, err := p.Plan(c.Context, w)
		if err != nil {
			return err
		}
		if cluster != nil && w.Override == "" {
			cluster.annotate(c.App.ErrWriter, pl)
		}
		sigs := candidateSignatures(c.Context, s.verifier, pl)
		if jsonOut(c) {
			out := any(pl)
			if sigs != nil {
				out = struct {
					*provision.Plan
					Signatures []candidateSignature `json:"signatures"`
				}{pl, sigs}
			}
			if err := writeJSON(c.App.Writer, out); err != nil {
				return err
			}
		} else {
			writePlan(c.App.Writer, pl)
			writeSignatures(c.App.Writer, sigs)
		}
		switch pl.Outcome {
		case images.OutcomeReady, provision.OutcomePinned:
			return nil
		case provision.OutcomeConflict:
			return cli.Exit("", exitError)
		}
		return cli.Exit("", exitNoResult)
	})
}

// want is the want of ref that --override says, checked before anything
// is fetched.
func want(c *cli.Context, ref string) (provision.Want, error) {
	w := provision.Want{Ref: ref, Override: c.String("override")}
	if c.IsSet("override") && w.Override == "" {
		w.Override = "auto"
	}
	if err := provision.ValidateWant(w); err != nil {
		return w, cli.Exit(err.Error(), exitUsage)
	}
	return w, nil
}

// writePlan prints a plan for a person: the node, the key and override
// and where they came from, the candidates in order, every rejection with
// its reason, and the outcome.
func writePlan(w io.Writer, p *provision.Plan) {
	fmt.Fprint(w, simulatedNote(p.Node))
	fmt.Fprintf(w, "plan for %s (override: %s, from %s)\n", p.Ref, p.Override, overrideFrom(p.OverrideFrom))
	fmt.Fprintf(w, "node: %s\n", nodeSummary(p.Node))
	if p.Key != "" {
		fmt.Fprintf(w, "pin key: %s (named by the %s)\n", p.Key, p.NamedBy)
	}
	if p.Source != "" && p.Source != p.Ref {
		fmt.Fprintf(w, "image: %s (the override's)\n", p.Source)
	}
	if p.Derived {
		fmt.Fprintln(w, "metadata: DERIVED from the image config (CUDA_VERSION, NVIDIA_REQUIRE_*): the image carries no io.gpupin annotations")
	}
	if p.Pinned != nil {
		fmt.Fprintf(w, "pinned: %s (%s), proved %s on this node; provision answers from it without the registry\n",
			p.Pinned.Ref, p.Pinned.Variant, p.Pinned.ProbedAt.Format("2006-01-02 15:04:05Z07:00"))
	} else if p.Held != nil {
		fmt.Fprintf(w, "held: %s (%s), from %s; kept unless a candidate passes\n", p.Held.Ref, p.Held.Variant, p.Held.Source)
	}
	if len(p.Candidates) > 0 {
		fmt.Fprintln(w, "candidates, in the order they would be tried:")
		for i, cand := range p.Candidates {
			how := ""
			if cand.Derived {
				how = "  (derived)"
			}
			fmt.Fprintf(w, "  %d. %-8s CUDA %-5s %s  %s  %s probe%s\n", i+1, cand.Variant, cand.CUDA, cand.Platform, cand.Ref, cand.Probe, how)
			if cand.Warning != "" {
				fmt.Fprintf(w, "     warning: %s\n", cand.Warning)
			}
		}
	}
	if len(p.Rejected) > 0 {
		fmt.Fprintln(w, "rejected:")
		for _, r := range p.Rejected {
			fmt.Fprintf(w, "  %s: %s\n", r.Variant, r.Reason)
		}
	}
	fmt.Fprintf(w, "outcome: %s\n", p.Outcome)
	if p.Detail != "" {
		fmt.Fprintf(w, "  %s\n", p.Detail)
	}
}

func overrideFrom(s string) string {
	switch s {
	case provision.OverrideFromSource:
		return "the overrides file"
	case provision.OverrideFromWant:
		return "--override"
	case "pin":
		return "the pin"
	}
	if strings.HasPrefix(s, "EngineOverride ") {
		return s
	}
	return "default"
}
