package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(provisionCommand()) }

func provisionCommand() *cli.Command {
	return &cli.Command{
		Name:      "provision",
		Usage:     "choose, pull, prove and pin each REF for this node",
		UsageText: "gpupin provision REF... [--override V] [--node FILE] [--json]",
		Description: "A pin proved on this node's driver and GPUs is used as it is, without the registry. " +
			"Otherwise the candidates are pulled by digest and probed in turn (auto falls back to the next); " +
			"the first that passes is pinned, and an earlier pin is replaced only then. " +
			"Exit 0 when every REF is ready, 3 when one is disabled or the node unsupported, 1 when one failed.",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "override", Usage: "auto, none, a variant name or an image reference, instead of the overrides file"},
			&cli.DurationFlag{Name: "probe-timeout", Value: defaultProbeTimeout, Usage: "kill a probe that runs longer"},
			&cli.StringFlag{Name: "probe", Usage: "probe to use when neither the image nor the engine names one: torch, cuda, exec"},
			&cli.StringFlag{Name: "probe-dir", Usage: "where probe programs are staged on the host"},
			&cli.StringFlag{Name: "cuda-probe", Usage: "path of the gpupin-cuda-probe binary"},
			&cli.StringFlag{Name: "lock-dir", Value: "/run/gpupin/locks", Usage: "per-engine locks shared with the agent and other gpupin processes"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			&cli.BoolFlag{Name: "json", Usage: "print the statuses as JSON"},
		}, gpuFlags()...), runtimeFlags()...),
		Action: runProvision,
	}
}

func runProvision(c *cli.Context) error {
	refs, err := trailingArgs(c)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if len(refs) == 0 {
		return cli.Exit("usage: gpupin provision REF... [--override V]", exitUsage)
	}
	var override string
	if c.IsSet("override") {
		if _, err := images.ParseOverride(c.String("override")); err != nil {
			return cli.Exit("--override: "+err.Error(), exitUsage)
		}
		override = c.String("override")
		if override == "" {
			override = "auto"
		}
	}
	p, closeRT, simulated, err := newProvisioner(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	defer closeRT()
	wants := make([]provision.Want, len(refs))
	for i, r := range refs {
		if _, err := images.ParseReference(r, nil); err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
		wants[i] = provision.Want{Ref: r, Override: override}
	}
	sts := p.Converge(c.Context, wants)
	if jsonOut(c) {
		if err := writeJSON(c.App.Writer, sts); err != nil {
			return cli.Exit(err.Error(), exitError)
		}
	} else {
		if simulated {
			fmt.Fprint(c.App.Writer, "SIMULATED node facts (from --node): probes were simulated; nothing here was proved on a GPU\n")
		}
		for _, st := range sts {
			writeStatus(c.App.Writer, st)
		}
	}
	return exitFor(sts)
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

func newProvisioner(c *cli.Context) (*provision.Provisioner, func(), bool, error) {
	nodes, err := nodeReader(c)
	if err != nil {
		return nil, nil, false, err
	}
	simulated := lineageString(c, "node") != ""
	rt, err := connect(c)
	if err != nil {
		return nil, nil, false, err
	}
	gpus, err := gpuSpec(c, simulated)
	if err != nil {
		rt.Close()
		return nil, nil, false, err
	}
	of, err := loadOverrideFile(c)
	if err != nil {
		rt.Close()
		return nil, nil, false, err
	}
	pp := newProgressPrinter(os.Stderr)
	opts := provision.Options{
		ProbeTimeout:    c.Duration("probe-timeout"),
		ProbeDir:        c.String("probe-dir"),
		CUDAProbeBinary: c.String("cuda-probe"),
		DefaultProbe:    c.String("probe"),
		GPUs:            gpus,
		Progress:        pp.report,
		OverrideFor:     of.Get,
		LockDir:         c.String("lock-dir"),
	}
	if !jsonOut(c) {
		opts.OnState = func(st provision.Status) {
			if st.State == provision.Probing {
				fmt.Fprintf(os.Stderr, "%s: %s\n", st.Key, st.Detail)
			}
		}
	}
	return provision.New(rt, resolver(c), nodes, opts), func() { rt.Close() }, simulated, nil
}

func writeStatus(w io.Writer, st provision.Status) {
	fmt.Fprintf(w, "%s: %s\n", st.Key, strings.ToUpper(string(st.State)))
	if st.Pinned != "" {
		fmt.Fprintf(w, "  pinned:   %s (%s)\n", st.Pinned, st.Variant)
	}
	fmt.Fprintf(w, "  detail:   %s\n", st.Detail)
	for _, a := range st.Attempts {
		fmt.Fprintf(w, "  tried:    %s at %s: %s\n", a.Variant, a.Stage, firstLine(a.Reason))
	}
	for _, r := range st.Rejected {
		fmt.Fprintf(w, "  rejected: %s: %s\n", r.Variant, r.Reason)
	}
	if st.Verdict != nil {
		for _, d := range st.Verdict.Devices {
			fmt.Fprintf(w, "  gpu %d:    %s (cc %s) %.1f TFLOP/s, max abs err %.3g\n", d.Index, d.Name, d.CC, d.TFLOPS, d.MaxAbsErr)
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
