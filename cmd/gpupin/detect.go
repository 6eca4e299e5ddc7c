package main

import (
	"cmp"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/node"
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
			"(containerd 1.6 has no notion of pinned images; gpupin restores pins there). " +
			"It says whether pulls store layer blobs and why (JSON: \"layers\"): where containerd's hosts configuration " +
			"(--hosts-dir) names a mirror for a registry, they are stored so peers can fetch them; " +
			"whether a mirror is configured for the node-local names' prefix (JSON: \"local_names\"), and what to add to its filters; " +
			"and whether the namespace is the one kubelet and a peer-to-peer mirror read (JSON: \"namespace\").",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the facts as JSON (the shape --node reads)"},
			&cli.StringFlag{Name: "node", Usage: "read node facts from `FILE` instead of NVML (SIMULATED)"},
			keepLayersFlag(),
		},
		Action: runDetect,
	}
}

func runDetect(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("detect takes no arguments, got %q", c.Args().First())
	}
	return inSession(c, tryContainerd, func(s *session) error {
		f, err := s.nodes.Read(c.Context)
		if err != nil {
			return fmt.Errorf("read node facts: %w", err)
		}
		w := c.App.Writer
		if jsonOut(c) {
			// The facts --node reads, and beside them (a key it ignores)
			// what containerd's CRI plugin does with pins, when it answers.
			out := struct {
				*node.Facts
				Containerd *containerd.CRIPinning   `json:"containerd,omitempty"`
				Namespace  *namespaceNote           `json:"namespace,omitempty"`
				Layers     *containerd.LayerStorage `json:"layers,omitempty"`
				LocalNames *containerd.LocalNames   `json:"local_names,omitempty"`
			}{Facts: f, Containerd: criPinning(c, s)}
			if s.rt != nil {
				out.Namespace = namespaceOf(s.rt)
				if ls, err := s.rt.LayerStorage(c.Context); err == nil {
					out.Layers = &ls
				}
				if ln, err := s.rt.LocalNames(c.Context); err == nil {
					out.LocalNames = &ln
				}
			}
			if err := writeJSON(w, out); err != nil {
				return err
			}
		} else {
			writeFacts(w, f)
			writeCRINote(c, w, s)
			writeFleetNotes(c, w, s)
			fmt.Fprint(w, decompressNote(containerd.FindDecompressors(decompressOptions())))
		}
		if !f.Supported() {
			return cli.Exit("", exitNoResult)
		}
		return nil
	})
}

// decompressNote says what decompresses gzip layers in pulls here: gpupin
// extracts layers itself and, as containerd does, runs igzip or unpigz when
// it finds them (about 4× and 1.5× Go's speed on one core); without either,
// a gzip image's pull is bound by Go's decoder.
func decompressNote(d containerd.Decompressors) string {
	switch filepath.Base(d.Gzip) {
	case "igzip":
		return fmt.Sprintf("gzip layers: igzip (%s)\n", d.Gzip)
	case "unpigz":
		return fmt.Sprintf("gzip layers: unpigz (%s); igzip decompresses about 2.5× faster (apt-get install isal)\n", d.Gzip)
	}
	return "gzip layers: Go's decoder: neither igzip nor unpigz is installed, so pulls of gzip images decompress 1.5–4× slower (apt-get install isal pigz; containerd's daemon uses them too)\n"
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
		fmt.Fprintf(w, "    brand:  %s\n", cmp.Or(g.Brand, "unknown"))
		fmt.Fprintf(w, "    cc:     %s\n", g.CC)
		mem := "unknown"
		if g.MemoryMiB > 0 {
			mem = fmt.Sprintf("%d MiB", g.MemoryMiB)
		}
		fmt.Fprintf(w, "    memory: %s\n", mem)
		fmt.Fprintf(w, "    mig:    %s\n", cmp.Or(g.MIG, "not reported"))
	}
}

// writeCRINote says, when containerd answers, whether its CRI plugin keeps
// pins from kubelet's image GC, and whether that was seen (the CRI plugin
// asked about a pinned record) or judged from the version: containerd 1.6
// has no notion of pinned images, and an operator should know that gpupin
// restores pins there rather than kubelet keeping them.
func writeCRINote(c *cli.Context, w io.Writer, s *session) {
	if s.rt == nil {
		reason, _, _ := strings.Cut(s.rtErr.Error(), "\n")
		fmt.Fprintf(w, "containerd:  not reached (%s)\n", reason)
		return
	}
	cri, err := s.rt.CRIPinning(c.Context)
	if err != nil {
		fmt.Fprintf(w, "containerd:  %s\n", err)
		return
	}
	fmt.Fprintf(w, "containerd:  %s, namespace %s\n", cri.Version, s.rt.Namespace())
	fmt.Fprintf(w, "  pinned:    %s\n", cri.Note)
	if cri.How == containerd.CRISeen {
		fmt.Fprintf(w, "  (seen: the CRI plugin reports %s pinned: %v)\n", cri.Image, cri.Kept)
	} else {
		fmt.Fprintf(w, "  (%s: %s)\n", cri.How, cri.Why)
	}
}

// namespaceNote says whether pins in the namespace are seen by kubelet
// and shared by a peer-to-peer mirror: both read k8s.io only.
type namespaceNote struct {
	Name string `json:"name"`
	// Kubernetes: the namespace kubelet (CRI) and Spegel read.
	Kubernetes bool   `json:"kubernetes"`
	Note       string `json:"note"`
}

func namespaceOf(rt *containerd.Runtime) *namespaceNote {
	n := &namespaceNote{Name: rt.Namespace(), Kubernetes: rt.Namespace() == containerd.CRINamespace}
	if n.Kubernetes {
		n.Note = "kubelet sees the pins and their local names, and a peer-to-peer mirror (Spegel) shares their blobs"
	} else {
		n.Note = fmt.Sprintf("kubelet and a peer-to-peer mirror (Spegel) read only %s: pods do not see pins made in %s, and peers get none of their blobs; "+
			"under Kubernetes give --namespace %s (CONTAINERD_NAMESPACE=%s, as the DaemonSet sets; the systemd unit reads it from /etc/gpupin/environment)", containerd.CRINamespace, n.Name, containerd.CRINamespace, containerd.CRINamespace)
	}
	return n
}

// writeFleetNotes says what matters on a node of a fleet: the namespace
// kubelet and a mirror read, whether pulls keep layer blobs for peers,
// and whether a mirror could serve the node-local names.
func writeFleetNotes(c *cli.Context, w io.Writer, s *session) {
	if s.rt == nil {
		return
	}
	fmt.Fprintf(w, "  namespace: %s\n", namespaceOf(s.rt).Note)
	if ls, err := s.rt.LayerStorage(c.Context); err != nil {
		fmt.Fprintf(w, "layers:      %s\n", err)
	} else {
		fmt.Fprintf(w, "layers:      %s\n", ls.Summary)
	}
	ln, err := s.rt.LocalNames(c.Context)
	switch {
	case err != nil:
		fmt.Fprintf(w, "local names: %s\n", err)
	case ln.Warning != "":
		fmt.Fprintf(w, "local names: WARNING: %s\n", ln.Warning)
	default:
		fmt.Fprintf(w, "local names: %s/ENGINE:VERSION; no mirror is configured for %s\n", ln.Prefix, ln.Prefix)
	}
}

// criPinning is what containerd's CRI plugin does with pins, or nil when
// containerd does not answer.
func criPinning(c *cli.Context, s *session) *containerd.CRIPinning {
	if s.rt == nil {
		return nil
	}
	cri, err := s.rt.CRIPinning(c.Context)
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
