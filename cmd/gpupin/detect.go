package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/runtime"
)

func init() { register(detectCommand) }

func detectCommand() *cli.Command {
	return &cli.Command{
		Name:      "detect",
		Usage:     "print this node's facts: driver, the CUDA it supports, every GPU",
		UsageText: "gpupin [--node FILE] detect [--json]",
		Description: "Reads NVML (or the facts file of --node, marked SIMULATED). " +
			"`detect --json` prints the JSON that --node reads. Exit 3 on a node without a usable NVIDIA driver. " +
			"When containerd answers at --address, it also says (JSON: \"containerd\") its version and whether its CRI plugin keeps pins " +
			"from kubelet's image GC, seen by asking the CRI plugin about a pinned record, else judged from the version " +
			"(containerd 1.6 has no notion of pinned images; gpupin restores pins there).",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the facts as JSON (the shape --node reads)"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
		},
		Action: runDetect,
	}
}

func runDetect(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("detect takes no arguments, got %q", c.Args().First()), exitUsage)
	}
	f, err := choiceNode(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	w := c.App.Writer
	if jsonOut(c) {
		// The facts --node reads, and beside them (a key it ignores) what
		// containerd's CRI plugin does with pins, when it answers.
		out := struct {
			*node.Facts
			Containerd *runtime.CRIPinning `json:"containerd,omitempty"`
		}{Facts: f, Containerd: criPinning(c)}
		if err := writeJSON(w, out); err != nil {
			return cli.Exit(err.Error(), exitError)
		}
	} else {
		writeFacts(w, f)
		writeCRINote(c, w)
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

// writeCRINote says, when containerd answers, whether its CRI plugin keeps
// pins from kubelet's image GC, and whether that was seen (the CRI plugin
// asked about a pinned record) or judged from the version: containerd 1.6
// has no notion of pinned images, and an operator should know that gpupin
// restores pins there rather than kubelet keeping them.
func writeCRINote(c *cli.Context, w io.Writer) {
	rt, err := connect(c, registryPolicy(c))
	if err != nil {
		fmt.Fprintf(w, "containerd:  not reached (%s)\n", firstLine(err.Error()))
		return
	}
	defer rt.Close()
	cri, err := rt.CRIPinning(c.Context)
	if err != nil {
		fmt.Fprintf(w, "containerd:  %s\n", err)
		return
	}
	fmt.Fprintf(w, "containerd:  %s, namespace %s\n", cri.Version, rt.Namespace())
	fmt.Fprintf(w, "  pinned:    %s\n", cri.Note)
	if cri.How == runtime.CRISeen {
		fmt.Fprintf(w, "  (seen: the CRI plugin reports %s pinned: %v)\n", cri.Image, cri.Kept)
	} else {
		fmt.Fprintf(w, "  (%s: %s)\n", cri.How, cri.Why)
	}
}

// criPinning is what containerd's CRI plugin does with pins, or nil when
// containerd does not answer.
func criPinning(c *cli.Context) *runtime.CRIPinning {
	rt, err := connect(c, registryPolicy(c))
	if err != nil {
		return nil
	}
	defer rt.Close()
	cri, err := rt.CRIPinning(c.Context)
	if err != nil {
		return nil
	}
	return &cri
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
	// The default: the outermost context that has the flag. (urfave/cli
	// puts a bare context above the app's, which has no flags at all.)
	for i := len(lineage) - 1; i >= 0; i-- {
		if v := lineage[i].String(name); v != "" {
			return v
		}
	}
	return ""
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
