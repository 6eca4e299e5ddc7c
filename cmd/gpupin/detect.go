package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/node"
)

func init() { register(detectCommand()) }

func detectCommand() *cli.Command {
	return &cli.Command{
		Name:      "detect",
		Usage:     "print this node's facts: driver, the CUDA it supports, every GPU",
		UsageText: "gpupin [--node FILE] detect [--json]",
		Description: "Reads NVML (or the facts file of --node, marked SIMULATED). " +
			"`detect --json` prints the JSON that --node reads. Exit 3 on a node without a usable NVIDIA driver.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the facts as JSON (the shape --node reads)"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
		},
		Action: runDetect,
	}
}

func runDetect(c *cli.Context) error {
	args, err := trailingArgs(c)
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	if len(args) > 0 {
		return cli.Exit(fmt.Sprintf("detect takes no arguments, got %q", args[0]), exitUsage)
	}
	f, err := choiceNode(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	w := c.App.Writer
	if jsonOut(c) {
		if err := writeJSON(w, f); err != nil {
			return cli.Exit(err.Error(), exitError)
		}
	} else {
		writeFacts(w, f)
	}
	if !f.Supported() {
		return cli.Exit("", exitNoResult)
	}
	return nil
}

// writeFacts prints facts for a person.
func writeFacts(w io.Writer, f *node.Facts) {
	fmt.Fprint(w, simulatedNote(f))
	if !f.Supported() {
		fmt.Fprintf(w, "unsupported: %s\n", f.Unsupported)
		if f.Driver != "" {
			fmt.Fprintf(w, "driver:   %s\n", f.Driver)
		}
		return
	}
	fmt.Fprintf(w, "driver:      %s\n", f.Driver)
	fmt.Fprintf(w, "cuda:        %s (the newest CUDA this driver supports)\n", f.CUDA)
	fmt.Fprintf(w, "platform:    %s\n", f.Platform)
	fmt.Fprintf(w, "fingerprint: %s\n", f.Fingerprint())
	fmt.Fprintf(w, "gpus:        %d\n", len(f.GPUs))
	for _, g := range f.GPUs {
		fmt.Fprintf(w, "  GPU %d  %s\n", g.Index, g.Name)
		fmt.Fprintf(w, "    uuid:   %s\n", g.UUID)
		fmt.Fprintf(w, "    brand:  %s\n", orUnknown(g.Brand))
		fmt.Fprintf(w, "    cc:     %s\n", g.CC)
		mem := "unknown"
		if g.MemoryMiB > 0 {
			mem = fmt.Sprintf("%d MiB", g.MemoryMiB)
		}
		fmt.Fprintf(w, "    memory: %s\n", mem)
		fmt.Fprintf(w, "    mig:    %s\n", orDefault(g.MIG, "not reported"))
	}
}

// nodeSummary is one line about the node, for plan.
func nodeSummary(f *node.Facts) string {
	if !f.Supported() {
		return "unsupported: " + f.Unsupported
	}
	gpus := make([]string, len(f.GPUs))
	for i, g := range f.GPUs {
		gpus[i] = fmt.Sprintf("%d %s (cc %s)", g.Index, g.Name, g.CC)
	}
	return fmt.Sprintf("driver %s, CUDA %s, %s, %d GPU(s): %s", f.Driver, f.CUDA, f.Platform, len(f.GPUs), strings.Join(gpus, "; "))
}

func orUnknown(s string) string { return orDefault(s, "unknown") }

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// writeJSON prints indented JSON to w (the app's writer, so tests capture it).
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	return nil
}

// lineageString returns a flag's value from the nearest command that set it
// (a subcommand's own --node, or the global one), else the global default.
// c.String alone would return a subcommand flag's empty default and hide the
// global flag.
func lineageString(c *cli.Context, name string) string {
	lineage := c.Lineage()
	for _, x := range lineage {
		if x.IsSet(name) {
			return x.String(name)
		}
	}
	return lineage[len(lineage)-1].String(name)
}

// choiceNode reads node facts from --node (at any level) or NVML.
func choiceNode(c *cli.Context) (*node.Facts, error) {
	if p := lineageString(c, "node"); p != "" {
		return node.LoadFile(p)
	}
	f, err := node.NewReader().Read(c.Context)
	if err != nil {
		return nil, fmt.Errorf("read node facts: %w", err)
	}
	return f, nil
}

// trailingArgs returns the positional arguments, applying any flags that
// follow them ("plan REF --json"): urfave/cli v2 stops parsing flags at the
// first argument, and the documented usage puts them after. "--" ends flags.
func trailingArgs(c *cli.Context) ([]string, error) {
	in := c.Args().Slice()
	var pos []string
	for i := 0; i < len(in); i++ {
		a := in[i]
		if a == "--" {
			return append(pos, in[i+1:]...), nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		fl := findFlag(c, name)
		if fl == nil {
			return nil, fmt.Errorf("flag provided but not defined: -%s", name)
		}
		if _, isBool := fl.(*cli.BoolFlag); isBool {
			if !hasValue {
				value = "true"
			}
		} else if !hasValue {
			if i+1 >= len(in) {
				return nil, fmt.Errorf("flag needs an argument: -%s", name)
			}
			i++
			value = in[i]
		}
		if err := c.Set(name, value); err != nil {
			return nil, fmt.Errorf("flag -%s: %w", name, err)
		}
	}
	return pos, nil
}

// findFlag finds a flag by name or alias on the command or any parent.
func findFlag(c *cli.Context, name string) cli.Flag {
	for _, x := range c.Lineage() {
		var flags []cli.Flag
		if x.Command != nil {
			flags = append(flags, x.Command.Flags...)
		}
		if x.App != nil && x.Command == nil {
			flags = append(flags, x.App.Flags...)
		}
		for _, f := range flags {
			for _, n := range f.Names() {
				if n == name {
					return f
				}
			}
		}
	}
	if c.App != nil {
		for _, f := range c.App.Flags {
			for _, n := range f.Names() {
				if n == name {
					return f
				}
			}
		}
	}
	return nil
}
