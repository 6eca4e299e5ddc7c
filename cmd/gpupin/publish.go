package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/build"
	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/trust"
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
		UsageText: "gpupin publish --tag REPO:VERSION --variant cu13=REF --variant cu129=REF [--engine vllm] [--archs cu13=7.5,8.0,9.0+PTX] [--annotation k=v]... [--sign-key cosign.key] [--dry-run] [--json]",
		Description: "Each variant image (single- or multi-platform) is checked against its own config: a cuNN variant " +
			"must have CUDA_VERSION NN.x, cuNNM NN.M. The index lists the lowest CUDA first, so a plain pull of the tag " +
			"gets the variant that runs on the oldest driver. Children are pushed by digest, then the alias tags " +
			"VERSION-VARIANT, then the tag; a failure before the tag leaves it as it was. A variant missing a platform " +
			"another variant has is refused unless --allow-partial-platforms. Registries are reached as nodes reach them: " +
			"--hosts-dir (certs.d: CA, client certificates, skip_verify), plain HTTP only for loopback and --insecure-registry, " +
			"the Docker config's credentials. With --sign-key, every manifest written (the variants', the aliases', the index) " +
			"is signed as cosign sign --key does once it is pushed by digest and before any tag is written, so a node " +
			"requiring a signature never sees the new tag unsigned; a signature that cannot be made or pushed fails the " +
			"publish with the tags as they were.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "tag", Aliases: []string{"t"}, Usage: "`REPO:VERSION` to publish (required)"},
			&cli.GenericFlag{Name: "variant", Value: &listValue{}, Usage: "`NAME=REF` of a variant image; repeat, in preference order for ties"},
			&cli.StringFlag{Name: "engine", Usage: "engine name (default: the io.gpupin.engine label, else the repository's last element)"},
			&cli.GenericFlag{Name: "archs", Value: &listValue{}, Usage: "`NAME=LIST` compute capabilities of a variant, overriding its io.gpupin.cuda.archs label and TORCH_CUDA_ARCH_LIST; repeatable"},
			&cli.GenericFlag{Name: "annotation", Value: &listValue{}, Usage: "`KEY=VALUE` added to the index and every entry; repeatable"},
			&cli.BoolFlag{Name: "allow-partial-platforms", Usage: "publish, with a warning, when a variant lacks a platform another has"},
			&cli.StringFlag{Name: "compression", Usage: "re-encode every variant's layers as `zstd` (nodes decompress it several times faster than gzip; containerd ≥ 1.5 reads it) or gzip; default: as the source has them"},
			&cli.BoolFlag{Name: "dry-run", Usage: "print the index that would be pushed; push nothing (--sign-key is loaded, nothing signed)"},
			signKeyFlag(),
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
	policy := registryPolicy(c)
	opts := build.PublishOptions{
		Tag:                   c.String("tag"),
		Engine:                c.String("engine"),
		Registry:              policy,
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
	signer, err := publishSigner(c, policy, "publish "+opts.Tag)
	if err != nil {
		return err
	}
	var sigs []trust.Signed
	opts.BeforeTag = signBeforeTag(signer, &sigs)
	res, err := build.Publish(c.Context, opts)
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintln(os.Stderr, "gpupin: warning:", w)
	}
	switch {
	case jsonOut(c):
		return writeJSON(c.App.Writer, signedResult{Result: res, Signatures: sigs})
	case opts.DryRun:
		if signer != nil {
			fmt.Fprintf(os.Stderr, "gpupin: dry run: signing %s loaded, nothing signed\n", signer.Key.Name)
		}
		return printIndex(c.App.Writer, res.Index)
	}
	printPublished(c.App.Writer, res)
	printSigned(c.App.Writer, sigs)
	return nil
}

// signedResult is publish's JSON: the publish, and its signatures when
// --sign-key was given.
type signedResult struct {
	*build.Result
	Signatures []trust.Signed `json:"signatures,omitempty"`
}

// publishSigner loads --sign-key before anything is pushed, so a missing
// file, a damaged key or a wrong COSIGN_PASSWORD costs no push and leaves
// the tag as it was. Signatures go through the registry policy the
// publish pushes by. nil, nil: no --sign-key.
func publishSigner(c *cli.Context, policy *registry.Policy, what string) (*trust.Signer, error) {
	path := c.String("sign-key")
	if path == "" {
		return nil, nil
	}
	key, err := trust.LoadSignKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: nothing pushed: %w", what, err)
	}
	return &trust.Signer{Key: key, Transport: policy.Transport(c.Context), Keychain: policy.Keychain()}, nil
}

// signBeforeTag is publish's and build's BeforeTag for --sign-key (nil
// without one): signatures land before the tags that make their manifests
// reachable, so a node whose policy requires one never sees the new tag
// unsigned. What was signed goes to *out.
func signBeforeTag(s *trust.Signer, out *[]trust.Signed) func(context.Context, *build.Result) error {
	if s == nil {
		return nil
	}
	return func(ctx context.Context, res *build.Result) error {
		sigs, err := signPublished(ctx, s, res)
		*out = sigs
		return err
	}
}

// signPublished signs, by digest, every manifest a publish wrote: each
// entry's (the variant manifests nodes choose, and verify), each alias
// index and the index (what cosign verify of the tag or an alias checks,
// and what a node passing the index digest may find signed). It runs
// before any tag is written; a rerun adds nothing where this key's
// signature is already.
func signPublished(ctx context.Context, s *trust.Signer, res *build.Result) ([]trust.Signed, error) {
	tag, err := name.NewTag(res.Tag)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", res.Tag, err)
	}
	var digests []string
	seen := map[string]bool{}
	add := func(d string) {
		if d != "" && !seen[d] {
			seen[d] = true
			digests = append(digests, d)
		}
	}
	for _, e := range res.Entries {
		add(e.Digest)
	}
	aliases := make([]string, 0, len(res.Aliases))
	for a := range res.Aliases {
		aliases = append(aliases, a)
	}
	sort.Strings(aliases)
	for _, a := range aliases {
		add(res.Aliases[a])
	}
	add(res.Digest)
	out := make([]trust.Signed, 0, len(digests))
	for _, d := range digests {
		sg, err := s.Sign(ctx, tag.Context().Digest(d))
		if err != nil {
			return out, fmt.Errorf("signing failed after %d of %d signatures (the tags are as they were; a rerun signs the rest): %w", len(out), len(digests), err)
		}
		out = append(out, sg)
	}
	return out, nil
}

func printSigned(w io.Writer, sigs []trust.Signed) {
	for _, s := range sigs {
		note := ""
		if s.Already {
			note = ", already signed"
		}
		_, d, _ := strings.Cut(s.Ref, "@")
		fmt.Fprintf(w, "  signed %s in %s (%d signature(s)%s)\n", d, s.Tag, s.Signatures, note)
	}
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

// signKeyFlag is publish's and build's --sign-key: CI signs what it pushes
// with the cosign key whose public half the nodes' policy lists.
func signKeyFlag() cli.Flag {
	return &cli.StringFlag{Name: "sign-key", EnvVars: []string{"GPUPIN_SIGN_KEY"}, Usage: "sign what is pushed with this cosign private key `FILE` (cosign generate-key-pair's; its password from COSIGN_PASSWORD): cosign's classic sha256-<hex>.sig signature over every variant manifest, every alias index and the index, which cosign verify --key and a --trust-policy naming the public key accept"}
}
