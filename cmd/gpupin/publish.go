package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/build"
)

func init() { register(publishCommand) }

// listValue is a repeatable flag that keeps commas: arch lists and
// annotation values contain them, and StringSliceFlag would split there.
type listValue struct{ vals []string }

func (l *listValue) Set(s string) error { l.vals = append(l.vals, s); return nil }
func (l *listValue) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.vals, " ")
}
func (l *listValue) Get() any { return l.vals }

// listFlag reads a listValue flag.
func listFlag(c *cli.Context, name string) []string {
	if v, ok := c.Generic(name).(*listValue); ok && v != nil {
		return v.vals
	}
	return nil
}

func publishCommand() *cli.Command {
	return &cli.Command{
		Name:      "publish",
		Usage:     "publish per-variant images as one tag: an OCI index with gpupin's metadata, plus an alias tag per variant",
		UsageText: "gpupin publish --tag REPO:VERSION --variant cu13=REF --variant cu129=REF [--engine vllm] [--archs cu13=7.5,8.0,9.0+PTX] [--annotation k=v]... [--dry-run] [--json]",
		Description: "Each variant image (single- or multi-platform) is checked against its own config: a cuNN variant " +
			"must have CUDA_VERSION NN.x, cuNNM NN.M. The index lists the lowest CUDA first, so a plain pull of the tag " +
			"gets the variant that runs on the oldest driver. Children are pushed by digest, then the alias tags " +
			"VERSION-VARIANT, then the tag; a failure before the tag leaves it as it was. A variant missing a platform " +
			"another variant has is refused unless --allow-partial-platforms. Registries are reached as nodes reach them: " +
			"--hosts-dir (certs.d: CA, client certificates, skip_verify), plain HTTP only for loopback and --insecure-registry, " +
			"the Docker config's credentials.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "tag", Aliases: []string{"t"}, Usage: "`REPO:VERSION` to publish (required)"},
			&cli.GenericFlag{Name: "variant", Value: &listValue{}, Usage: "`NAME=REF` of a variant image; repeat, in preference order for ties"},
			&cli.StringFlag{Name: "engine", Usage: "engine name (default: the io.gpupin.engine label, else the repository's last element)"},
			&cli.GenericFlag{Name: "archs", Value: &listValue{}, Usage: "`NAME=LIST` compute capabilities of a variant, overriding its io.gpupin.cuda.archs label and TORCH_CUDA_ARCH_LIST; repeatable"},
			&cli.GenericFlag{Name: "annotation", Value: &listValue{}, Usage: "`KEY=VALUE` added to the index and every entry; repeatable"},
			&cli.BoolFlag{Name: "allow-partial-platforms", Usage: "publish, with a warning, when a variant lacks a platform another has"},
			&cli.StringFlag{Name: "compression", Usage: "re-encode every variant's layers as `zstd` (nodes decompress it several times faster than gzip; containerd ≥ 1.5 reads it) or gzip; default: as the source has them"},
			&cli.BoolFlag{Name: "dry-run", Usage: "print the index that would be pushed; push nothing"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		Action: runPublish,
	}
}

func runPublish(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("unexpected argument %q (variants are given with --variant NAME=REF)", c.Args().First())
	}
	// Checked here, not with urfave/cli's Required, whose refusal exits 1:
	// a usage error exits 2.
	if c.String("tag") == "" {
		return usageError("--tag REPO:VERSION is required")
	}
	opts := build.PublishOptions{
		Tag:                   c.String("tag"),
		Engine:                c.String("engine"),
		Registry:              registryPolicy(c),
		DryRun:                c.Bool("dry-run"),
		AllowPartialPlatforms: c.Bool("allow-partial-platforms"),
	}
	comp, err := build.ParseCompression(c.String("compression"))
	if err != nil {
		return cli.Exit("--"+err.Error(), exitUsage)
	}
	opts.Compression = comp
	archs := map[string]string{}
	for _, a := range listFlag(c, "archs") {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" || v == "" {
			return usageError("--archs %q: want NAME=LIST, e.g. cu13=7.5,8.0,9.0+PTX", a)
		}
		archs[k] = v
	}
	for _, v := range listFlag(c, "variant") {
		k, ref, ok := strings.Cut(v, "=")
		if !ok || k == "" || ref == "" {
			return usageError("--variant %q: want NAME=REF, e.g. cu13=registry/org/vllm:0.11.0-cu13-ci", v)
		}
		opts.Variants = append(opts.Variants, build.Variant{Name: k, Ref: ref, Archs: archs[k]})
		delete(archs, k)
	}
	for k := range archs {
		return usageError("--archs %s=…: no --variant %s", k, k)
	}
	if len(opts.Variants) == 0 {
		return usageError("give at least one --variant NAME=REF")
	}
	ann, err := parseAnnotations(listFlag(c, "annotation"))
	if err != nil {
		return usageError("%v", err)
	}
	opts.Annotations = ann
	res, err := build.Publish(c.Context, opts)
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(os.Stderr, "gpupin: warning:", w)
	}
	switch {
	case jsonOut(c):
		return writeJSON(c.App.Writer, res)
	case opts.DryRun:
		return printIndex(c.App.Writer, res.Index)
	}
	printPublished(c.App.Writer, res)
	return nil
}

func parseAnnotations(list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, a := range list {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--annotation %q: want KEY=VALUE", a)
		}
		out[k] = v
	}
	return out, nil
}

func printIndex(w io.Writer, raw []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

func printPublished(w io.Writer, res *build.Result) {
	fmt.Fprintf(w, "published %s@%s (verified)\n", res.Tag, res.Digest)
	for i, e := range res.Entries {
		fmt.Fprintf(w, "  %d. %-8s %-14s CUDA %-5s %s\n", i+1, e.Variant, e.Platform, e.Annotations["io.gpupin.cuda.version"], e.Digest)
	}
	seen := map[string]bool{}
	for _, e := range res.Entries {
		if a := res.Tag + "-" + e.Variant; res.Aliases[a] != "" && !seen[a] {
			seen[a] = true
			fmt.Fprintf(w, "  alias %s@%s\n", a, res.Aliases[a])
		}
	}
}
