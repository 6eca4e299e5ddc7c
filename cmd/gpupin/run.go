package main

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(runCommand) }

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "start a replica from the pinned image of ENGINE:VERSION (or the pin of REF), with the GPUs injected",
		UsageText: "gpupin run ENGINE:VERSION|REF [--gpus …] -- ARGS...",
		Description: "Only a pinned image runs: the point of a pin is that replicas start from the image that was proved. " +
			"The replica has normal privileges (the default capabilities), containerd's default seccomp profile (--seccomp " +
			"unconfined takes it off) and the node's network; --memory and --pids bound it (memory with no swap beyond it). " +
			"It is removed when it exits, and gpupin exits with its code.",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "net", Value: "host", Usage: "host (serve on the node's network) or none"},
			&cli.StringFlag{Name: "seccomp", Value: string(containerd.SeccompDefault), Usage: "syscall filter: default (containerd's default profile: no keyctl, and no unshare, setns, mount, bpf … without CAP_SYS_ADMIN) or unconfined (none)"},
			&cli.StringFlag{Name: "memory", Usage: "memory limit, `SIZE` in bytes or with a binary unit (512m, 64GiB); swap is not allowed beyond it; none when empty"},
			&cli.Int64Flag{Name: "pids", Usage: "limit on the replica's processes and threads; 0 = none"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "extra environment, KEY=VALUE"},
			&cli.StringFlag{Name: "name", Usage: "container name (default gpupin-replica-RANDOM)"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED: no GPU is injected unless --gpu-mode says so)"},
		}, gpuFlags()...), runtimeFlags()...),
		Action: runRun,
	}
}

func runRun(c *cli.Context) error {
	// Flags after the target were moved before it (reorderArgs); what
	// follows "--" is the replica's, untouched, flags and all.
	args := c.Args().Slice()
	if len(args) < 1 || args[0] == "--" {
		return usageError("usage: gpupin run ENGINE:VERSION|REF -- ARGS")
	}
	target, cmdArgs := args[0], args[1:]
	if len(cmdArgs) > 0 && cmdArgs[0] == "--" {
		cmdArgs = cmdArgs[1:]
	}
	spec, err := replicaSpec(c)
	if err != nil {
		return err
	}
	spec.Args = cmdArgs
	return inSession(c, needContainerd, func(s *session) error {
		w := c.App.ErrWriter
		p, err := s.provisioner()
		if err != nil {
			return err
		}
		res, err := p.RunPinned(c.Context, target, spec, func(r provision.Replica) {
			if r.Stale {
				fmt.Fprintf(w, "warning: %s was proved under another driver or GPU set; gpupin provision re-proves it\n", r.Pin.Key)
			}
			if r.Simulated {
				fmt.Fprintf(w, "SIMULATED: %s was pinned on simulated node facts; no GPU was proved\n", r.Pin.Key)
			}
			if spec.Seccomp == containerd.SeccompUnconfined {
				fmt.Fprintf(w, "warning: --seccomp unconfined: the replica's syscalls are not filtered\n")
			}
			fmt.Fprintf(w, "running %s from %s (%s)\n", r.Pin.Key, r.Pin.Ref, r.Pin.Variant)
		})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return cli.Exit("", res.ExitCode)
		}
		return nil
	})
}

// replicaSpec is the run the flags ask for: network, syscall filter,
// limits, environment, name; its output goes to gpupin's own.
func replicaSpec(c *cli.Context) (containerd.RunSpec, error) {
	spec := containerd.RunSpec{Env: c.StringSlice("env"), ID: c.String("name"), PidsLimit: c.Int64("pids"),
		Stdout: c.App.Writer, Stderr: c.App.ErrWriter, OutputLimit: 1}
	switch c.String("net") {
	case "host":
		spec.HostNetwork = true
	case "none":
	default:
		return spec, usageError("--net: want host or none")
	}
	var err error
	if spec.Seccomp, err = containerd.ParseSeccomp(c.String("seccomp")); err != nil {
		return spec, usageError("--seccomp: %v", err)
	}
	if v := c.String("memory"); v != "" {
		if spec.MemoryLimit, err = parseBytes(v); err != nil || spec.MemoryLimit == 0 {
			return spec, usageError("--memory %q: want a size such as 512m or 64GiB", v)
		}
	}
	if spec.PidsLimit < 0 {
		return spec, usageError("--pids: want 0 (none) or a positive limit")
	}
	return spec, nil
}

// sizeRE is a size: a number, then an optional binary unit.
var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(?:i?b)?|b)?$`)

// parseBytes reads a size: plain bytes, or a number with a binary unit
// (k, m, g, t, alone or as KiB, KB …, any case: 512m = 512MiB = 512 × 2^20),
// as Docker's --memory reads it. Fractions are allowed (1.5g); the result
// is rounded down to a byte.
// formatBytes writes n as parseBytes reads it, in the largest unit that
// divides it.
func formatBytes(n uint64) string {
	for i := 3; i >= 0; i-- {
		if u := uint64(1) << (10 * (i + 1)); n >= u && n%u == 0 {
			return strconv.FormatUint(n/u, 10) + string("kmgt"[i])
		}
	}
	return strconv.FormatUint(n, 10)
}

func parseBytes(s string) (uint64, error) {
	m := sizeRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("size %q: want bytes or a number with k, m, g or t", s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	if m[2] != "" {
		v *= math.Pow(1024, float64(strings.Index("kmgt", m[2])+1))
	}
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return uint64(v), nil
}
