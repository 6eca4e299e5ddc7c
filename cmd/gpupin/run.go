package main

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/runtime"
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
			&cli.StringFlag{Name: "seccomp", Value: string(runtime.SeccompDefault), Usage: "syscall filter: default (containerd's default profile: no keyctl, and no unshare, setns, mount, bpf … without CAP_SYS_ADMIN) or unconfined (none)"},
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
		return cli.Exit("usage: gpupin run ENGINE:VERSION|REF -- ARGS", exitUsage)
	}
	target, cmdArgs := args[0], args[1:]
	if len(cmdArgs) > 0 && cmdArgs[0] == "--" {
		cmdArgs = cmdArgs[1:]
	}
	if c.String("net") != "host" && c.String("net") != "none" {
		return cli.Exit("--net: want host or none", exitUsage)
	}
	seccomp, err := runtime.ParseSeccomp(c.String("seccomp"))
	if err != nil {
		return cli.Exit("--seccomp: "+err.Error(), exitUsage)
	}
	var memory uint64
	if v := c.String("memory"); v != "" {
		if memory, err = parseBytes(v); err != nil || memory == 0 {
			return cli.Exit(fmt.Sprintf("--memory %q: want a size such as 512m or 64GiB", v), exitUsage)
		}
	}
	if c.Int64("pids") < 0 {
		return cli.Exit("--pids: want 0 (none) or a positive limit", exitUsage)
	}
	rt, err := connect(c, registryPolicy(c))
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	defer rt.Close()
	// The library's lookup: a tampered record is refused, never run.
	pin, err := rt.PinToRun(c.Context, target)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	simulated := lineageString(c, "node") != ""
	if f, err := choiceNode(c); err == nil && f.Supported() && f.Fingerprint() != pin.Node {
		fmt.Fprintf(os.Stderr, "warning: %s was proved under another driver or GPU set; gpupin provision re-proves it\n", pin.Key)
	}
	gpus, err := gpuSpec(c)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if gpus == nil {
		g := runtime.DefaultGPUs(simulated)
		gpus = &g
	}
	if simulated || pin.Simulated {
		fmt.Fprintf(os.Stderr, "SIMULATED: %s was pinned on simulated node facts; no GPU was proved\n", pin.Key)
	}
	if seccomp == runtime.SeccompUnconfined {
		fmt.Fprintf(os.Stderr, "warning: --seccomp unconfined: the replica's syscalls are not filtered\n")
	}
	fmt.Fprintf(os.Stderr, "running %s from %s (%s)\n", pin.Key, pin.Ref, pin.Variant)
	res, err := rt.Run(c.Context, runtime.RunSpec{
		Image: pin.Ref, Args: cmdArgs, Env: c.StringSlice("env"), GPUs: *gpus, Role: "replica",
		HostNetwork: c.String("net") == "host", ID: c.String("name"),
		Seccomp: seccomp, MemoryLimit: memory, PidsLimit: c.Int64("pids"),
		Stdout: c.App.Writer, Stderr: c.App.ErrWriter, OutputLimit: 1,
		Labels: map[string]string{runtime.LabelPin: pin.Key},
	})
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	if res.ExitCode != 0 {
		return cli.Exit("", res.ExitCode)
	}
	return nil
}

// sizeRE is a size: a number, then an optional binary unit.
var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(?:i?b)?|b)?$`)

// parseBytes reads a size: plain bytes, or a number with a binary unit
// (k, m, g, t, alone or as KiB, KB …, any case: 512m = 512MiB = 512 × 2^20),
// as Docker's --memory reads it. Fractions are allowed (1.5g); the result
// is rounded down to a byte.
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
