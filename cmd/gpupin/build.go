package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/build"
	"github.com/gpupin/gpupin/trust"
)

func init() { register(buildCommand) }

func buildCommand() *cli.Command {
	return &cli.Command{
		Name:      "build",
		Usage:     "assemble variant images from gpupin.yaml without a Docker engine, then write an OCI layout and/or publish",
		UsageText: "gpupin build [-f gpupin.yaml] [--output DIR] [--push [--sign-key cosign.key]] [--json]",
		Description: "Reproducible: every timestamp is SOURCE_DATE_EPOCH (default 0), tar entries are sorted, owned by 0:0 " +
			"and their modes normalised, so the same inputs give the same digests and changing one file changes only " +
			"its layer. --push publishes as `gpupin publish` does, to repository:version, with the metadata on the " +
			"child manifests too; with --sign-key, every manifest pushed is signed as cosign sign --key does, before the tags are written.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Value: "gpupin.yaml", Usage: "spec `FILE`"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "write an OCI layout to `DIR`"},
			&cli.BoolFlag{Name: "push", Usage: "publish to the spec's repository"},
			&cli.GenericFlag{Name: "annotation", Value: &listValue{}, Usage: "`KEY=VALUE` added to the index and every entry; repeatable"},
			&cli.BoolFlag{Name: "allow-partial-platforms", Usage: "publish, with a warning, when a variant lacks a platform another has"},
			&cli.StringFlag{Name: "compression", Usage: "encode the layers as `zstd` (the base's re-encoded too; nodes decompress it several times faster than gzip) or gzip; default: gzip for gpupin's layers, the base's as they are"},
			signKeyFlag(),
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
		},
		Action: runBuild,
	}
}

func runBuild(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("unexpected argument %q (the spec is given with -f)", c.Args().First())
	}
	spec, err := build.LoadSpec(c.String("file"))
	if err != nil {
		return err
	}
	ann, err := parseAnnotations(listFlag(c, "annotation"))
	if err != nil {
		return usageError("%v", err)
	}
	comp, err := build.ParseCompression(c.String("compression"))
	if err != nil {
		return cli.Exit("--"+err.Error(), exitUsage)
	}
	if !c.Bool("push") && c.String("output") == "" {
		fmt.Fprintln(os.Stderr, "gpupin: neither --output nor --push: building only, to check the spec and print digests")
	}
	// A signature is over what a registry holds: an OCI layout alone
	// has nowhere for cosign's signature tag to go.
	if c.String("sign-key") != "" && !c.Bool("push") {
		return usageError("--sign-key signs what is pushed: give --push too")
	}
	policy := registryPolicy(c)
	signer, err := publishSigner(c, policy, "build "+c.String("file"))
	if err != nil {
		return err
	}
	var sigs []trust.Signed
	res, err := build.Build(c.Context, build.BuildOptions{
		Spec:                  spec,
		Output:                c.String("output"),
		Push:                  c.Bool("push"),
		Annotations:           ann,
		AllowPartialPlatforms: c.Bool("allow-partial-platforms"),
		Registry:              policy,
		Compression:           comp,
		BeforeTag:             signBeforeTag(signer, &sigs),
	})
	if err != nil {
		return err
	}
	if res.Publish != nil {
		for _, w := range res.Publish.Warnings {
			fmt.Fprintln(os.Stderr, "gpupin: warning:", w)
		}
	}
	if jsonOut(c) {
		return writeJSON(c.App.Writer, signedBuild{BuildResult: res, Signatures: sigs})
	}
	w := c.App.Writer
	for _, im := range res.Images {
		fmt.Fprintf(w, "%-8s %-14s %s\n", im.Variant, im.Platform, im.Digest)
	}
	fmt.Fprintf(w, "index %s\n", res.Index)
	if res.Output != "" {
		fmt.Fprintf(w, "wrote OCI layout %s\n", res.Output)
	}
	if res.Publish != nil {
		printPublished(w, res.Publish)
		printSigned(w, sigs)
	}
	return nil
}

// signedBuild is build's JSON when it signed what it pushed.
type signedBuild struct {
	*build.BuildResult
	Signatures []trust.Signed `json:"signatures,omitempty"`
}
