package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

func init() { register(overrideCommand) }

func overrideCommand() *cli.Command {
	jsonFlag := func() cli.Flag { return &cli.BoolFlag{Name: "json", Usage: "print JSON"} }
	return &cli.Command{
		Name:  "override",
		Usage: "force a variant, none, or an image of your own for an engine on this node",
		Description: "Overrides live in the file of --overrides (default " + images.DefaultOverridesPath + "), written atomically.\n" +
			images.OverrideForms,
		Subcommands: []*cli.Command{
			{
				Name:      "set",
				Usage:     "set ENGINE's override",
				UsageText: "gpupin override set ENGINE auto|none|VARIANT|IMAGE [--ref REF]",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "ref", Usage: "check a variant name against the variants published under `REF`"},
					jsonFlag(),
				},
				Action: runOverrideSet,
			},
			{
				Name:      "get",
				Usage:     "print ENGINE's override (auto when none is set)",
				UsageText: "gpupin override get ENGINE [--json]",
				Flags:     []cli.Flag{jsonFlag()},
				Action:    runOverrideGet,
			},
			{
				Name:      "list",
				Usage:     "print every override",
				UsageText: "gpupin override list [--json]",
				Flags:     []cli.Flag{jsonFlag()},
				Action:    runOverrideList,
			},
			{
				Name:      "clear",
				Usage:     "remove ENGINE's override (back to auto)",
				UsageText: "gpupin override clear ENGINE",
				Flags:     []cli.Flag{jsonFlag()},
				Action:    runOverrideClear,
			},
		},
	}
}

// overrideEntry is one override as --json prints it.
type overrideEntry struct {
	Engine   string `json:"engine"`
	Override string `json:"override"`
	Kind     string `json:"kind"`
	Set      bool   `json:"set"`
	File     string `json:"file"`
}

func loadOverrideFile(c *cli.Context) (*images.OverrideFile, error) {
	return images.LoadOverrides(lineageString(c, "overrides"))
}

func runOverrideSet(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) != 2 {
		return cli.Exit("usage: gpupin override set ENGINE VALUE [--ref REF]; "+images.OverrideForms, exitUsage)
	}
	engine, value := args[0], args[1]
	ov, err := images.ParseOverride(value)
	if err == nil && !images.ValidEngineName(engine) {
		err = fmt.Errorf("%q is not an engine name", engine)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	// The registry is asked before the file is locked: a slow registry
	// must not hold up the agent's writes.
	if ref := c.String("ref"); ref != "" {
		if err := checkOverrideAgainst(c, engine, ov, ref); err != nil {
			return err
		}
	}
	var setErr error
	of, err := images.UpdateOverrides(lineageString(c, "overrides"), func(of *images.OverrideFile) error {
		ov, setErr = of.Set(engine, value)
		return setErr
	})
	if setErr != nil {
		return cli.Exit(setErr.Error(), exitUsage)
	}
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	if jsonOut(c) {
		return jsonOrExit(c, overrideEntry{Engine: engine, Override: ov.String(), Kind: string(ov.Kind), Set: true, File: of.Path})
	}
	fmt.Fprintf(c.App.Writer, "%s: %s (%s), in %s\n", engine, ov, ov.Kind, of.Path)
	return nil
}

// checkOverrideAgainst resolves ref and refuses a variant it does not
// publish, or a ref of another engine: named as provision names it (its
// io.gpupin.engine, else its repository's last element).
func checkOverrideAgainst(c *cli.Context, engine string, ov images.Override, ref string) error {
	p := provision.New(nil, provision.WithResolver(&images.Resolver{Remote: registryPolicy(c)}))
	named, err := p.Name(c.Context, provision.Want{Ref: ref})
	if errors.Is(err, provision.ErrInvalidWant) {
		return cli.Exit(fmt.Sprintf("--ref: %v", err), exitUsage)
	}
	if err != nil {
		return cli.Exit(fmt.Sprintf("--ref: %v", err), exitError)
	}
	if named.Engine != engine {
		return cli.Exit(fmt.Sprintf("--ref %s is engine %s (named by its %s), not %s", ref, named.Engine, namedByWords(named.NamedBy), engine), exitUsage)
	}
	if ov.Kind != images.OverrideVariant {
		return nil
	}
	seen := map[string]bool{}
	var published []string
	for _, v := range named.Set.Variants {
		if !seen[v.Variant] {
			seen[v.Variant] = true
			published = append(published, v.Variant)
		}
	}
	if !seen[ov.Variant] {
		sort.Strings(published)
		return cli.Exit(fmt.Sprintf("variant %s is not published under %s; published: %s", ov.Variant, ref, strings.Join(published, ", ")), exitUsage)
	}
	return nil
}

// namedByWords says how a key was named, as a person reads it.
func namedByWords(by string) string {
	switch by {
	case provision.NamedByMetadata:
		return "io.gpupin.engine metadata"
	case provision.NamedByPin:
		return "pin"
	case provision.NamedByWant:
		return "want"
	}
	return "repository's last element"
}

func runOverrideGet(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) != 1 {
		return cli.Exit("usage: gpupin override get ENGINE", exitUsage)
	}
	engine := args[0]
	if !images.ValidEngineName(engine) {
		return cli.Exit(fmt.Sprintf("%q is not an engine name", engine), exitUsage)
	}
	of, err := loadOverrideFile(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	ov, set := of.Get(engine)
	if jsonOut(c) {
		return jsonOrExit(c, overrideEntry{Engine: engine, Override: ov.String(), Kind: string(ov.Kind), Set: set, File: of.Path})
	}
	if set {
		fmt.Fprintf(c.App.Writer, "%s\n", ov)
	} else {
		fmt.Fprintf(c.App.Writer, "auto (not set in %s)\n", of.Path)
	}
	return nil
}

func runOverrideList(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) > 0 {
		return cli.Exit("usage: gpupin override list", exitUsage)
	}
	of, err := loadOverrideFile(c)
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	if jsonOut(c) {
		out := struct {
			File      string            `json:"file"`
			Overrides map[string]string `json:"overrides"`
		}{of.Path, of.Overrides}
		return jsonOrExit(c, out)
	}
	if len(of.Overrides) == 0 {
		fmt.Fprintf(c.App.Writer, "no overrides in %s: every engine is auto\n", of.Path)
		return nil
	}
	for _, e := range of.Engines() {
		fmt.Fprintf(c.App.Writer, "%s\t%s\n", e, of.Overrides[e])
	}
	return nil
}

func runOverrideClear(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) != 1 {
		return cli.Exit("usage: gpupin override clear ENGINE", exitUsage)
	}
	engine := args[0]
	if !images.ValidEngineName(engine) {
		return cli.Exit(fmt.Sprintf("%q is not an engine name", engine), exitUsage)
	}
	var was bool
	of, err := images.UpdateOverrides(lineageString(c, "overrides"), func(of *images.OverrideFile) error {
		was = of.Clear(engine)
		return nil
	})
	if err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	if jsonOut(c) {
		return jsonOrExit(c, overrideEntry{Engine: engine, Override: "auto", Kind: string(images.OverrideAuto), Set: false, File: of.Path})
	}
	if was {
		fmt.Fprintf(c.App.Writer, "%s: cleared, now auto\n", engine)
	} else {
		fmt.Fprintf(c.App.Writer, "%s: no override was set; it is auto\n", engine)
	}
	return nil
}

func jsonOrExit(c *cli.Context, v any) error {
	if err := writeJSON(c.App.Writer, v); err != nil {
		return cli.Exit(err.Error(), exitError)
	}
	return nil
}
