package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/runtime"
)

func init() { register(runCommand()) }

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "start a replica from the pinned image of ENGINE:VERSION (or the pin of REF), with the GPUs injected",
		UsageText: "gpupin run ENGINE:VERSION|REF [--gpus …] -- ARGS...",
		Description: "Only a pinned image runs: the point of a pin is that replicas start from the image that was proved. " +
			"The replica has normal privileges and the node's network; it is removed when it exits, and gpupin exits with its code.",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "net", Value: "host", Usage: "host (serve on the node's network) or none"},
			&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "extra environment, KEY=VALUE"},
			&cli.StringFlag{Name: "name", Usage: "container name (default gpupin-replica-RANDOM)"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED: no GPU is injected unless --gpu-mode says so)"},
		}, gpuFlags()...), runtimeFlags()...),
		Action: runRun,
	}
}

func runRun(c *cli.Context) error {
	args, err := trailingArgs(c)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if len(args) < 1 {
		return cli.Exit("usage: gpupin run ENGINE:VERSION|REF -- ARGS", exitUsage)
	}
	target, cmdArgs := args[0], args[1:]
	if c.String("net") != "host" && c.String("net") != "none" {
		return cli.Exit("--net: want host or none", exitUsage)
	}
	rt, err := connect(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	defer rt.Close()
	pins, err := rt.Pins(c.Context)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	var pin *runtime.Pin
	for i, p := range pins {
		if p.Key == target || p.Ref == target || p.Source == target {
			pin = &pins[i]
			break
		}
	}
	if pin == nil {
		var keys []string
		for _, p := range pins {
			keys = append(keys, p.Key)
		}
		return cli.Exit(fmt.Sprintf("%s has no pin (pinned: %s); run gpupin provision first", target, strings.Join(orNone(keys), ", ")), exitError)
	}
	simulated := lineageString(c, "node") != ""
	if f, err := choiceNode(c); err == nil && f.Supported() && f.Fingerprint() != pin.Node {
		fmt.Fprintf(os.Stderr, "warning: %s was proved under another driver or GPU set; gpupin provision re-proves it\n", pin.Key)
	}
	gpus, err := gpuSpec(c, simulated)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if simulated || pin.Simulated {
		fmt.Fprintf(os.Stderr, "SIMULATED: %s was pinned on simulated node facts; no GPU was proved\n", pin.Key)
	}
	fmt.Fprintf(os.Stderr, "running %s from %s (%s)\n", pin.Key, pin.Ref, pin.Variant)
	res, err := rt.Run(c.Context, runtime.RunSpec{
		Image: pin.Ref, Args: cmdArgs, Env: c.StringSlice("env"), GPUs: *gpus, Role: "replica",
		HostNetwork: c.String("net") == "host", ID: c.String("name"),
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

func orNone(s []string) []string {
	if len(s) == 0 {
		return []string{"none"}
	}
	return s
}
