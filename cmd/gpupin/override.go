package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/images"
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

func runOverrideSet(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) != 2 {
		return usageError("usage: gpupin override set ENGINE VALUE [--ref REF]; %s", images.OverrideForms)
	}
	engine, value := args[0], args[1]
	// Checked before the registry is asked (--ref); the engine is the
	// caller's own argument, so the refusal need not name it.
	ov, err := images.ParseOverride(value)
	if err == nil {
		err = images.CheckEngine(engine)
	}
	if err != nil {
		return usageError("%v", err)
	}
	// The registry is asked before the file is locked: a slow registry
	// must not hold up the agent's writes.
	if ref := c.String("ref"); ref != "" {
		err := inSession(c, noContainerd, func(s *session) error {
			p, err := s.provisioner()
			if err != nil {
				return err
			}
			if err := p.CheckOverride(c.Context, engine, ov, ref); err != nil {
				return fmt.Errorf("--ref: %w", err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	ov, of, err := images.SetOverride(lineageString(c, "overrides"), engine, value)
	var refused *images.Refusal
	switch {
	case errors.As(err, &refused):
		return usageError("%v", err)
	case err != nil:
		return err
	case jsonOut(c):
		return writeJSON(c.App.Writer, overrideEntry{Engine: engine, Override: ov.String(), Kind: string(ov.Kind), Set: true, File: of.Path})
	}
	fmt.Fprintf(c.App.Writer, "%s: %s (%s), in %s\n", engine, ov, ov.Kind, of.Path)
	return nil
}

// engineArg is the one argument of get and clear, an engine name.
func engineArg(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", usageError("usage: %s", c.Command.UsageText)
	}
	engine := c.Args().First()
	if err := images.CheckEngine(engine); err != nil {
		return "", usageError("%v", err)
	}
	return engine, nil
}

func runOverrideGet(c *cli.Context) error {
	engine, err := engineArg(c)
	if err != nil {
		return err
	}
	of, err := images.LoadOverrides(lineageString(c, "overrides"))
	if err != nil {
		return err
	}
	ov, set := of.Get(engine)
	switch {
	case jsonOut(c):
		return writeJSON(c.App.Writer, overrideEntry{Engine: engine, Override: ov.String(), Kind: string(ov.Kind), Set: set, File: of.Path})
	case set:
		fmt.Fprintf(c.App.Writer, "%s\n", ov)
	default:
		fmt.Fprintf(c.App.Writer, "auto (not set in %s)\n", of.Path)
	}
	return nil
}

func runOverrideList(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageError("usage: gpupin override list")
	}
	of, err := images.LoadOverrides(lineageString(c, "overrides"))
	if err != nil {
		return err
	}
	if jsonOut(c) {
		return writeJSON(c.App.Writer, struct {
			File      string            `json:"file"`
			Overrides map[string]string `json:"overrides"`
		}{of.Path, of.Overrides})
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
	engine, err := engineArg(c)
	if err != nil {
		return err
	}
	var was bool
	of, err := images.UpdateOverrides(lineageString(c, "overrides"), func(of *images.OverrideFile) error {
		was = of.Clear(engine)
		return nil
	})
	switch {
	case err != nil:
		return err
	case jsonOut(c):
		return writeJSON(c.App.Writer, overrideEntry{Engine: engine, Override: "auto", Kind: string(images.OverrideAuto), Set: false, File: of.Path})
	case was:
		fmt.Fprintf(c.App.Writer, "%s: cleared, now auto\n", engine)
	default:
		fmt.Fprintf(c.App.Writer, "%s: no override was set; it is auto\n", engine)
	}
	return nil
}
