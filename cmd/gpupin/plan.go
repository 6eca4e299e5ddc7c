package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

func init() { register(planCommand()) }

func planCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "show which variant of REF this node would get, and why (reads manifests only, pulls nothing)",
		UsageText: "gpupin plan REF [--override auto|none|VARIANT|IMAGE] [--node FILE] [--json]",
		Description: "The override comes from --override, else from the overrides file for the engine " +
			"(the io.gpupin.engine annotation, else the repository's last path element). " +
			"Exit 0 when a candidate exists, 3 when none fits, the override is none or the node is unsupported, 1 on error, 2 on usage.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "override", Usage: "auto, none, a variant name or an image reference, instead of the overrides file"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			&cli.BoolFlag{Name: "json", Usage: "print the plan as JSON"},
		},
		Action: runPlan,
	}
}

func runPlan(c *cli.Context) error {
	args, err := trailingArgs(c)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if len(args) != 1 {
		return cli.Exit("usage: gpupin plan REF [--override V] [--node FILE] [--json]", exitUsage)
	}
	ref := args[0]
	if _, err := images.ParseReference(ref, nil); err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	var flagOv *images.Override
	if c.IsSet("override") {
		ov, err := images.ParseOverride(c.String("override"))
		if err != nil {
			return cli.Exit("--override: "+err.Error(), exitUsage)
		}
		flagOv = &ov
	}
	f, err := choiceNode(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	p, derived, err := makePlan(c, f, ref, flagOv)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	w := c.App.Writer
	if jsonOut(c) {
		if err := writeJSON(w, p); err != nil {
			return cli.Exit(err.Error(), exitError)
		}
	} else {
		writePlan(w, p, derived)
	}
	if p.Outcome != images.OutcomeReady {
		return cli.Exit("", exitNoResult)
	}
	return nil
}

// makePlan resolves ref, finds the engine's override and chooses. It
// reports whether any metadata considered was derived from image configs.
func makePlan(c *cli.Context, f *node.Facts, ref string, flagOv *images.Override) (*images.Plan, bool, error) {
	ov := images.Override{Kind: images.OverrideAuto}
	if flagOv != nil {
		ov = *flagOv
	}
	if !f.Supported() {
		// Nothing to resolve for a node that cannot run any variant.
		return images.Choose(f, &images.Set{Ref: ref}, ov), false, nil
	}
	res := resolver(c)
	set, err := res.Resolve(c.Context, ref)
	if err != nil {
		return nil, false, err
	}
	if flagOv == nil {
		engine, err := engineOf(ref, set)
		if err != nil {
			return nil, false, err
		}
		path := lineageString(c, "overrides")
		of, err := images.LoadOverrides(path)
		if err != nil {
			return nil, false, err
		}
		ov, _ = of.Get(engine)
	}
	chooseFrom := set
	if ov.Kind == images.OverrideImage {
		// The operator's image replaces the engine's: its variants are the
		// ones chosen among (and still probed).
		chooseFrom, err = res.Resolve(c.Context, ov.Image)
		if err != nil {
			return nil, false, fmt.Errorf("override image: %w", err)
		}
	}
	p := images.Choose(f, chooseFrom, ov)
	p.Ref = ref // what was asked for; the candidates name the override image
	return p, anyDerived(chooseFrom), nil
}

// engineOf names the engine of a reference: the io.gpupin.engine annotation
// of its variants, else the repository's last path element.
func engineOf(ref string, set *images.Set) (string, error) {
	for _, v := range set.Variants {
		if v.Engine != "" {
			return v.Engine, nil
		}
	}
	r, err := images.ParseReference(ref, nil)
	if err != nil {
		return "", err
	}
	return images.EngineFromRepo(r), nil
}

func anyDerived(set *images.Set) bool {
	for _, v := range set.Variants {
		if v.Derived {
			return true
		}
	}
	return false
}

// writePlan prints a plan for a person: the node, the candidates in order,
// every rejection with its reason, and the outcome.
func writePlan(w io.Writer, p *images.Plan, derived bool) {
	fmt.Fprint(w, simulatedNote(p.Node))
	fmt.Fprintf(w, "plan for %s (override: %s)\n", p.Ref, p.Override)
	fmt.Fprintf(w, "node: %s\n", nodeSummary(p.Node))
	if derived {
		fmt.Fprintln(w, "metadata: DERIVED from the image config (CUDA_VERSION, NVIDIA_REQUIRE_*): the image carries no io.gpupin annotations")
	}
	if len(p.Candidates) > 0 {
		fmt.Fprintln(w, "candidates, in the order they would be tried:")
		for i, cand := range p.Candidates {
			how := ""
			if cand.Derived {
				how = "  (derived)"
			}
			fmt.Fprintf(w, "  %d. %-8s CUDA %-5s %s  %s%s\n", i+1, cand.Variant, cand.CUDA, cand.Platform, cand.Ref, how)
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
