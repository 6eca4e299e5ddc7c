// Command gpupin provisions GPU inference engines on NVIDIA nodes from
// container images: it picks the CUDA variant the node can run, pulls it,
// proves it with a compute probe, and pins it by digest.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Exit codes scripts can rely on.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitNoResult = 3 // no variant fits, override none, or an unsupported node
)

// order fixes the help listing; each command's file registers itself.
var order = []string{"detect", "plan", "provision", "pins", "unpin", "run", "gc", "probe", "override", "agent", "publish", "build"}

// commands make each command afresh: urfave/cli keeps parsed flag values
// (repeatable lists among them) and help names in the Command it runs, so
// an app run twice in one process (the tests do) must not share them.
var commands []func() *cli.Command

func register(c func() *cli.Command) { commands = append(commands, c) }

// gcPercent is gpupin's GOGC unless the environment sets one. A pull's
// live heap is small and bounded (four layers' stream buffers and zstd
// windows, about 20 MiB), but it makes garbage at the download's rate,
// and Go's default lets the heap reach twice the live heap before a
// collection: on the bench's zstd image that was a 42 MiB heap and 105 MiB
// peak RSS on containerd 1.6, where gpupin runs beside the node's
// workloads. At 25 the heap stays within 1.25 times the live heap: 88 MiB
// peak, at no time measurable beside the pull's (docs/benchmarks.md).
const gcPercent = 25

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	app, args := newApp(), os.Args
	if len(args) > 0 && filepath.Base(args[0]) == pluginName {
		app, args = asPlugin(app), pluginArgs(app, args)
	}
	msg, code := execute(ctx, app, args)
	if msg != "" {
		fmt.Fprintf(os.Stderr, "%s: %s\n", app.Name, msg)
	}
	stop()
	os.Exit(code)
}

// execute runs the app on args (flags after arguments reordered) and
// returns the message to print and the exit code: main and the tests take
// this one path, so what the tests see is what the binary does.
func execute(ctx context.Context, app *cli.App, args []string) (msg string, code int) {
	err := app.RunContext(ctx, reorderArgs(app, args))
	if err == nil {
		return "", exitOK
	}
	var ec cli.ExitCoder
	if !errors.As(err, &ec) {
		return err.Error(), exitError
	}
	msg, code = err.Error(), ec.ExitCode()
	if strings.HasPrefix(msg, "No help topic for") {
		code = exitUsage // urfave's help command says 3 for an unknown topic
	}
	return msg, code
}

func newApp() *cli.App {
	rank := map[string]int{}
	for i, n := range order {
		rank[n] = i
	}
	cmds := make([]*cli.Command, 0, len(commands))
	for _, c := range commands {
		cmds = append(cmds, c())
	}
	sort.SliceStable(cmds, func(i, j int) bool { return rank[cmds[i].Name] < rank[cmds[j].Name] })
	usageExits(cmds)
	return &cli.App{
		Name:                   "gpupin",
		Usage:                  "choose, prove and pin the CUDA variant of an inference engine this node can run",
		Flags:                  globalFlags(),
		Commands:               cmds,
		UseShortOptionHandling: true,
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return cli.Exit(err.Error(), exitUsage)
		},
		Before: setupLogging,
		Action: unknownCommand,
		// Without a handler of its own, urfave/cli exits the process from
		// inside RunContext on any ExitCoder (os.Exit, before execute can
		// map "No help topic" to 2): errors come back to execute instead.
		ExitErrHandler: func(*cli.Context, error) {},
	}
}
