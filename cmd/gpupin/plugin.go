package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// pluginName is the name kubectl runs gpupin under: `kubectl gpupin ARGS`
// executes the first kubectl-gpupin on PATH (the packages link it to
// gpupin) with ARGS.
const pluginName = "kubectl-gpupin"

// pluginArgs makes a kubectl-gpupin command line gpupin's: with no command
// it is `gpupin fleet` (kubectl users come for the fleet's table), and a
// first word that names a command (plan, override, …) runs that command,
// so `kubectl gpupin plan REF --node-name N` works too. Global flags may
// come first; -h/--help is the whole app's help, which lists both. Any
// other first word is left for the app to refuse as no command, rather
// than for fleet to refuse as an argument.
func pluginArgs(app *cli.App, args []string) []string {
	if len(args) == 0 {
		return []string{pluginName, "fleet"}
	}
	out, rest := []string{args[0]}, args[1:]
	i := 0
	for i < len(rest) && strings.HasPrefix(rest[i], "-") && rest[i] != "-" && rest[i] != "--" {
		if rest[i] == "-h" || rest[i] == "--help" {
			return append(out, rest...)
		}
		n := flagArity(app.Flags, rest[i])
		if n == 0 {
			break // not global: fleet's own (--kubeconfig), or for fleet to refuse
		}
		if i+n > len(rest) {
			return append(out, rest...) // its value missing: for urfave/cli to say so
		}
		i += n
	}
	if i < len(rest) && !strings.HasPrefix(rest[i], "-") {
		return append(out, rest...)
	}
	out = append(out, rest[:i]...)
	out = append(out, "fleet")
	return append(out, rest[i:]...)
}

// asPlugin names the app and its usage lines `kubectl gpupin`, as the
// user typed it.
func asPlugin(app *cli.App) *cli.App {
	app.Name = "kubectl gpupin"
	app.HelpName = "kubectl gpupin"
	app.Usage = "gpupin as a kubectl plugin: with no command, the fleet's engines (kubectl gpupin fleet)"
	app.UsageText = "kubectl gpupin [--kubeconfig FILE] [--json]\nkubectl gpupin COMMAND [flags] [ARGS...]"
	var rename func(cmds []*cli.Command)
	rename = func(cmds []*cli.Command) {
		for _, c := range cmds {
			if rest, ok := strings.CutPrefix(c.UsageText, "gpupin "); ok {
				c.UsageText = "kubectl gpupin " + rest
			}
			if c.Name == "fleet" {
				c.UsageText = strings.Replace(c.UsageText, "kubectl gpupin fleet ", "kubectl gpupin [fleet] ", 1)
			}
			rename(c.Subcommands)
		}
	}
	rename(app.Commands)
	return app
}
