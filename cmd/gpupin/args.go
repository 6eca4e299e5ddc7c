package main

import (
	"fmt"
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
		if n == 0 || i+n > len(args) {
			// Unknown, or its value is missing: left as given, for
			// urfave/cli to refuse by name.
			return args
		}
		out = append(out, args[i:i+n]...)
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
			if i+n > len(args) {
				// The last word, and its value missing: last where the
				// command's flags are parsed, so urfave/cli says so
				// ("flag needs an argument") rather than taking the
				// next argument for its value.
				return append(append(append(append(out, globals...), path...), flags...), a)
			}
			flags = append(flags, args[i:i+n]...)
			i += n
			continue
		}
		if n := flagArity(app.Flags, a); n > 0 {
			if i+n > len(args) {
				// The same for a global flag, where globals are parsed.
				return append(append(out, globals...), a)
			}
			globals = append(globals, args[i:i+n]...)
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

// usageExits makes every usage error exit 2, on every command: a flag
// refused, and a command or subcommand that does not exist (urfave/cli's
// own answer to that exits 3, which is gpupin's "no result").
func usageExits(cmds []*cli.Command) {
	for _, c := range cmds {
		c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
			return cli.Exit(err.Error(), exitUsage)
		}
		if len(c.Subcommands) > 0 && c.Action == nil {
			c.Action = unknownCommand
		}
		usageExits(c.Subcommands)
	}
}

// unknownCommand is the action of the app and of commands that only have
// subcommands: reached with an argument, that argument names no command.
func unknownCommand(c *cli.Context) error {
	root := c.Command == nil || c.Command.Name == c.App.Name
	if c.Args().Present() {
		where := c.App.Name
		if !root {
			where += " " + c.Command.Name
		}
		return cli.Exit(fmt.Sprintf("%s has no command %q (see %s --help)", where, c.Args().First(), where), exitUsage)
	}
	if root {
		return cli.ShowAppHelp(c)
	}
	return cli.ShowSubcommandHelp(c)
}
