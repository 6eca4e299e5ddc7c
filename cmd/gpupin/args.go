package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// reorderArgs lets flags follow a command's arguments, as every usage line
// writes them ("gpupin probe REF --probe torch"): urfave/cli v2 stops at
// the first argument. Flags after the arguments are moved before them; a
// global flag given after the command moves before the command, where it
// is defined. "--" ends the flags, and what follows it stays as it is.
func reorderArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	i := 1
	// Global flags before the command.
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "-" && args[i] != "--" {
		n := flagArity(app.Flags, args[i])
		out = append(out, args[i:min(i+n, len(args))]...)
		i += n
	}
	if i >= len(args) {
		return out
	}
	// The command, and its subcommands.
	cmds := app.Commands
	var path []string
	var cmd *cli.Command
	for i < len(args) {
		next := findCommand(cmds, args[i])
		if next == nil {
			break
		}
		cmd = next
		path = append(path, args[i])
		cmds = cmd.Subcommands
		i++
	}
	if cmd == nil {
		return args
	}
	var globals, flags, pos []string
	for i < len(args) {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			i++
			continue
		}
		if n := flagArity(cmd.Flags, a); n > 0 {
			flags = append(flags, args[i:min(i+n, len(args))]...)
			i += n
			continue
		}
		if n := flagArity(app.Flags, a); n > 0 {
			globals = append(globals, args[i:min(i+n, len(args))]...)
			i += n
			continue
		}
		// Unknown: left where it is, for urfave/cli to refuse by name.
		flags = append(flags, a)
		i++
	}
	out = append(out, globals...)
	out = append(out, path...)
	out = append(out, flags...)
	return append(out, pos...)
}

// flagArity is how many arguments a flag takes up (itself and its value),
// or 0 when it is not among flags.
func flagArity(flags []cli.Flag, arg string) int {
	name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if hasValue {
				return 1
			}
			if _, ok := f.(*cli.BoolFlag); ok {
				return 1
			}
			return 2
		}
	}
	if name == "help" || name == "h" {
		return 1
	}
	return 0
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// usageExits makes every usage error exit 2, on every command.
func usageExits(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
			return cli.Exit(err.Error(), exitUsage)
		}
		usageExits(c.Subcommands)
	}
}
