package main

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// leaf is a command that runs (has no subcommands), with its path under gpupin.
type leaf struct {
	path []string
	cmd  *cli.Command
}

func leaves(cmds []*cli.Command, parent []string) []leaf {
	var out []leaf
	for _, c := range cmds {
		p := append(append([]string(nil), parent...), c.Name)
		if len(c.Subcommands) > 0 {
			out = append(out, leaves(c.Subcommands, p)...)
			continue
		}
		out = append(out, leaf{path: p, cmd: c})
	}
	return out
}

// usageLine is what a command's usage line says: its positional
// arguments (before "--"), whether it takes ARGS after "--", and the flags
// it names.
type usageLine struct {
	positional []string
	dashdash   bool
	flags      []string
}

// parseUsage reads a usage line such as
// "gpupin plan REF [--override auto|none|VARIANT|IMAGE] [--node FILE] [--json]".
func parseUsage(l leaf, app *cli.App) usageLine {
	var u usageLine
	words := strings.Fields(l.cmd.UsageText)
	if len(words) > 0 && words[0] == "gpupin" {
		words = words[1:]
	}
	inPath := map[string]bool{}
	for _, p := range l.path {
		inPath[p] = true
	}
	depth := 0
	for i := 0; i < len(words); i++ {
		w := words[i]
		bare := strings.Trim(w, "[]")
		if strings.HasPrefix(bare, "-") && bare != "--" {
			name := strings.TrimLeft(bare, "-")
			name, _, _ = strings.Cut(name, "=")
			u.flags = append(u.flags, name)
			// An unbracketed flag's value is the next word (publish's
			// --tag REPO:VERSION).
			if depth == 0 && !strings.HasPrefix(w, "[") && flagArity(append(l.cmd.Flags, app.Flags...), "--"+name) == 2 && i+1 < len(words) {
				i++
			}
		}
		if bare == "--" && depth == 0 {
			u.dashdash = true
			break
		}
		opened := depth > 0 || strings.HasPrefix(w, "[")
		depth += strings.Count(w, "[") - strings.Count(w, "]")
		if opened || strings.HasPrefix(bare, "-") || inPath[bare] {
			continue
		}
		u.positional = append(u.positional, bare)
	}
	return u
}

// valueFor is a value each kind of flag accepts.
func valueFor(f cli.Flag) (string, bool) {
	switch f.(type) {
	case *cli.BoolFlag:
		return "", false
	case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag, *cli.Float64Flag:
		return "1", true
	case *cli.DurationFlag:
		return "1s", true
	case *cli.GenericFlag:
		return "k=v", true
	}
	return "v", true
}

func findFlagIn(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// seen is what a command's action was called with.
type seen struct {
	path []string
	args []string
	set  map[string]bool
}

// recordingApp is gpupin's app with every action replaced by one that
// records its arguments and which flags were set, at any level: what the
// command would have acted on. The commands are copies; gpupin's own stay
// as they are.
func recordingApp(got *seen) *cli.App {
	app := newApp()
	var clone func(cmds []*cli.Command, parent []string) []*cli.Command
	clone = func(cmds []*cli.Command, parent []string) []*cli.Command {
		out := make([]*cli.Command, len(cmds))
		for i, c := range cmds {
			cc := *c
			path := append(append([]string(nil), parent...), c.Name)
			cc.Subcommands = clone(c.Subcommands, path)
			if len(c.Subcommands) == 0 {
				cc.Action = func(ctx *cli.Context) error {
					got.path, got.args, got.set = path, ctx.Args().Slice(), map[string]bool{}
					for _, x := range ctx.Lineage() {
						for _, n := range x.FlagNames() {
							if x.IsSet(n) {
								got.set[n] = true
							}
						}
					}
					return nil
				}
			}
			out[i] = &cc
		}
		return out
	}
	app.Commands = clone(app.Commands, nil)
	app.Before = nil
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	return app
}

// Every command accepts its flags after its arguments, as its usage line
// writes them (issue 10, point 5: "gpupin probe REF --probe torch" and
// "gpupin unpin X --json" were usage errors): each flag of each command,
// and a global flag, given after the positional arguments reaches the
// command, and the arguments arrive as given. What follows "--" (run's
// ARGS) is not parsed, flags and all.
func TestFlagsAfterArgumentsEveryCommand(t *testing.T) {
	base := newApp()
	ls := leaves(base.Commands, nil)
	if len(ls) < len(order) {
		t.Fatalf("%d commands found, want at least the %d of the help order", len(ls), len(order))
	}
	for _, l := range ls {
		l := l
		name := strings.Join(l.path, " ")
		u := parseUsage(l, base)
		t.Run(name, func(t *testing.T) {
			if l.cmd.UsageText == "" {
				t.Fatalf("%s has no usage line", name)
			}
			// The usage line names only flags there are.
			for _, f := range u.flags {
				if findFlagIn(l.cmd.Flags, f) == nil && findFlagIn(base.Flags, f) == nil {
					t.Errorf("usage line %q names --%s, which %s does not define", l.cmd.UsageText, f, name)
				}
			}
			pos := make([]string, len(u.positional))
			for i := range pos {
				pos[i] = "arg" + string(rune('1'+i))
			}
			var required []string
			for _, f := range l.cmd.Flags {
				if rf, ok := f.(cli.RequiredFlag); ok && rf.IsRequired() {
					v, _ := valueFor(f)
					required = append(required, "--"+f.Names()[0], v)
				}
			}
			flags := append([]cli.Flag{findFlagIn(base.Flags, "namespace")}, l.cmd.Flags...)
			for _, f := range flags {
				fname := f.Names()[0]
				if fname == "help" {
					continue
				}
				args := append(append([]string{"gpupin"}, l.path...), pos...)
				if v, ok := valueFor(f); ok {
					args = append(args, "--"+fname, v)
				} else {
					args = append(args, "--"+fname)
				}
				args = append(args, required...)
				wantArgs := append([]string(nil), pos...)
				if u.dashdash {
					tail := []string{"--", "/bin/sh", "--json", "-c", "--", "--" + fname}
					args = append(args, tail...)
					wantArgs = append(wantArgs, tail...)
				}
				var got seen
				app := recordingApp(&got)
				if err := app.RunContext(context.Background(), reorderArgs(app, args)); err != nil {
					t.Errorf("%q: %v", args[1:], err)
					continue
				}
				if !reflect.DeepEqual(got.path, l.path) {
					t.Errorf("%q ran %q, want %q", args[1:], got.path, l.path)
					continue
				}
				if !got.set[fname] {
					t.Errorf("%q: --%s after the arguments was not applied", args[1:], fname)
				}
				if len(wantArgs) == 0 {
					wantArgs = []string{}
				}
				if len(got.args) == 0 {
					got.args = []string{}
				}
				if !reflect.DeepEqual(got.args, wantArgs) {
					t.Errorf("%q: the command got arguments %q, want %q", args[1:], got.args, wantArgs)
				}
			}
		})
	}
}

// runBounded is choiceRun that fails the test instead of hanging: an
// argument list once sent the reordering into an endless loop.
func runBounded(t *testing.T, args ...string) (stdout, errMsg string, code int) {
	t.Helper()
	type result struct {
		out, msg string
		code     int
	}
	done := make(chan result, 1)
	go func() {
		app := newApp()
		var out, errOut bytes.Buffer
		app.Writer, app.ErrWriter = &out, &errOut
		r := result{}
		r.msg, r.code = execute(context.Background(), app, append([]string{"gpupin"}, args...))
		r.out = out.String()
		done <- r
	}()
	select {
	case r := <-done:
		return r.out, r.msg, r.code
	case <-time.After(20 * time.Second):
		t.Fatalf("gpupin %q did not return in 20s", args)
	}
	return "", "", 0
}

// Every usage error exits 2, on every command: an unknown flag before or
// after the arguments, a flag whose value is missing (the last word; a
// global one too), an unknown command or subcommand, and arguments to a
// command that takes none. None of these reaches containerd or a
// registry: --address names a socket that does not exist, which would be
// exit 1.
func TestUsageErrorsExitTwoEveryCommand(t *testing.T) {
	base := newApp()
	type call struct {
		args []string
		want string // in the message
	}
	var calls []call
	for _, l := range leaves(base.Commands, nil) {
		u := parseUsage(l, base)
		pos := make([]string, len(u.positional))
		for i := range pos {
			pos[i] = "arg" + string(rune('1'+i))
		}
		at := func(extra ...string) []string {
			return append(append(append([]string{"--address", "/nonexistent/containerd.sock"}, l.path...), pos...), extra...)
		}
		calls = append(calls,
			call{at("--bogus"), "flag provided but not defined: -bogus"},
			call{append(append([]string{"--address", "/nonexistent/containerd.sock"}, l.path...), append([]string{"--bogus"}, pos...)...), "flag provided but not defined: -bogus"},
			call{at("--namespace"), "flag needs an argument: -namespace"},
		)
		for _, f := range l.cmd.Flags {
			if _, ok := valueFor(f); !ok {
				continue
			}
			n := f.Names()[0]
			calls = append(calls, call{at("--" + n), "flag needs an argument: -" + n})
		}
		if len(u.positional) == 0 && !u.dashdash {
			calls = append(calls, call{at("extra"), ""})
		}
	}
	calls = append(calls,
		call{[]string{"--bogus", "plan", "reg/x:1"}, "flag provided but not defined: -bogus"},
		call{[]string{"--namespace"}, "flag needs an argument: -namespace"},
		call{[]string{"nosuch"}, `gpupin has no command "nosuch"`},
		call{[]string{"override", "bogus"}, `gpupin override has no command "bogus"`},
		call{[]string{"help", "bogus"}, "No help topic for 'bogus'"},
		call{[]string{"plan", "--bogus"}, "not defined: -bogus"},
		call{[]string{"gc", "--runc-root"}, "not defined: -runc-root"},
		call{[]string{"--address", "/nonexistent/containerd.sock", "unpin"}, "usage: gpupin unpin"},
		call{[]string{"override", "set", "vllm"}, "usage: gpupin override set ENGINE VALUE"},
		call{[]string{"publish", "--variant", "cu13=reg/x:1"}, "--tag REPO:VERSION is required"},
		call{[]string{"publish", "--tag", "reg/x:1", "extra"}, `unexpected argument "extra"`},
	)
	for _, c := range calls {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			out, msg, code := runBounded(t, c.args...)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d (usage); error %q; stdout:\n%s", code, exitUsage, msg, out)
			}
			if !strings.Contains(msg, c.want) {
				t.Errorf("error %q, want it to say %q", msg, c.want)
			}
		})
	}
}

// The reordering itself, on the cases the usage lines write. (An unknown
// global flag before the command, which once looped for ever, is in
// TestUsageErrorsExitTwoEveryCommand, under a deadline.)
func TestReorderArgs(t *testing.T) {
	app := newApp()
	for _, tc := range []struct{ in, want string }{
		{"probe REF --probe torch", "probe --probe torch REF"},
		{"unpin X --json", "unpin --json X"},
		{"plan REF --namespace ns --json", "--namespace ns plan --json REF"},
		{"run REF --net none -- sh --json -c x", "run --net none REF -- sh --json -c x"},
		{"run REF -- --net none", "run REF -- --net none"},
		{"override set vllm cu13 --ref r", "override set --ref r vllm cu13"},
		{"plan REF --override", "plan --override"},
		{"plan REF --namespace", "--namespace"},
		{"--node f plan REF", "--node f plan REF"},
		{"plan REF --bogus", "plan --bogus REF"},
	} {
		got := strings.Join(reorderArgs(app, append([]string{"gpupin"}, strings.Fields(tc.in)...))[1:], " ")
		if got != tc.want {
			t.Errorf("reorderArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
