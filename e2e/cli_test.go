// Package e2e runs the gpupin binary as an operator would, against a real
// containerd and a loopback registry, on simulated node facts.
package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

var gpupinBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here runs the built binary, most against a daemon:
		// none is the fast tier's.
		fmt.Println("e2e: -short: skipped (make test runs it)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "gpupin-e2e-bin-")
	if err != nil {
		panic(err)
	}
	gpupinBin = filepath.Join(dir, "gpupin")
	build := exec.Command("go", "build", "-o", gpupinBin, "github.com/gpupin/gpupin/cmd/gpupin")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		panic("build gpupin: " + err.Error() + "\n" + string(out))
	}
	// testenv.Main would os.Exit before a deferred RemoveAll ran: the
	// binary's directory is removed once the tests are done.
	code := testenv.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

type cli struct {
	t    *testing.T
	base []string
	dir  string
}

func newCLI(t *testing.T, reg *sandbox.Registry) *cli {
	d := testenv.Containerd(t)
	dir := t.TempDir()
	node := filepath.Join(dir, "node.json")
	os.WriteFile(node, []byte(`{"driver":"580.82.07","cuda":"13.0","gpus":[{"index":0,"uuid":"GPU-e2e","name":"NVIDIA H100 80GB HBM3","cc":"9.0"}]}`), 0o644)
	return &cli{t: t, dir: dir, base: []string{
		"--address", d.Address, "--namespace", testenv.Namespace(t), "--node", node,
		"--overrides", filepath.Join(dir, "overrides.yaml"),
	}}
}

// run runs gpupin with the global flags, then args; command flags that
// need the test's runc root are added after the command name.
func (c *cli) run(args ...string) (string, int) {
	c.t.Helper()
	full := append([]string{}, c.base...)
	full = append(full, args[0])
	switch args[0] {
	case "provision", "run", "probe":
		full = append(full, "--runc-root", testenv.Containerd(c.t).RuncRoot)
	}
	if args[0] == "provision" || args[0] == "probe" {
		full = append(full, "--probe-dir", filepath.Join(c.dir, "probe"))
	}
	full = append(full, args[1:]...)
	cmd := exec.Command(gpupinBin, full...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatal(err)
	}
	return string(out), code
}

func TestCLISimulatedProvisionPinsRunProbeUnpinGC(t *testing.T) {
	reg := testenv.Registry(t)
	bad := sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", Archs: "9.0", SimProbe: "fail"}
	good := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "9.0"}
	if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "eng", "2.0", []sandbox.EngineVariant{good, bad}); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/eng:2.0"
	c := newCLI(t, reg)

	// Flags after the arguments, as the usage lines write them.
	out, code := c.run("provision", ref, "--json")
	if code != 0 {
		t.Fatalf("provision exit %d:\n%s", code, out)
	}
	var sts []provision.Status
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &sts); err != nil {
		t.Fatalf("provision --json: %v\n%s", err, out)
	}
	if len(sts) != 1 || sts[0].State != provision.Ready || sts[0].Variant != "cu129" || !sts[0].Simulated || len(sts[0].Attempts) != 1 {
		t.Fatalf("statuses: %+v", sts)
	}
	pinned := sts[0].Pinned

	out, code = c.run("pins")
	if code != 0 || !strings.Contains(out, "eng:2.0") || !strings.Contains(out, "proved, SIMULATED") {
		t.Fatalf("pins exit %d:\n%s", code, out)
	}

	// A flag after the target is gpupin's; what follows "--" is the
	// replica's, untouched: flags, a second "--" and all.
	out, code = c.run("run", "eng:2.0", "--env", "E2E=after-the-target", "--",
		"/bin/sh", "-c", `echo replica CUDA_VERSION=$CUDA_VERSION env=$E2E args="$*"; exit 7`, "sh", "--json", "--", "--env", "x")
	if code != 7 || !strings.Contains(out, "replica CUDA_VERSION=12.9.0 env=after-the-target args=--json -- --env x\n") || !strings.Contains(out, "SIMULATED") {
		t.Fatalf("run exit %d (want the replica's 7, with its arguments as given):\n%s", code, out)
	}

	out, code = c.run("probe", pinned, "--probe", "cuda", "--json")
	if code != 0 || !strings.Contains(out, `"ok": true`) || !strings.Contains(out, `"simulated": true`) {
		t.Fatalf("probe exit %d:\n%s", code, out)
	}

	out, code = c.run("unpin", "eng:2.0", "--json")
	var unpinned containerd.Pin
	if err := json.Unmarshal([]byte(out), &unpinned); code != 0 || err != nil || unpinned.Key != "eng:2.0" || unpinned.Ref != pinned {
		t.Fatalf("unpin --json exit %d (%v), pin %+v, want eng:2.0 at %s:\n%s", code, err, unpinned, pinned, out)
	}
	// The unpinned image is the previous pin: gc keeps it, gc --all removes it.
	out, code = c.run("gc", "--json")
	if code != 0 || strings.Contains(out, pinned+`"`+"\n") && strings.Contains(out, `"removed": [`+"\n"+`    "`+pinned) {
		t.Fatalf("gc exit %d:\n%s", code, out)
	}
	var gc struct{ Removed, Kept []string }
	json.Unmarshal([]byte(out), &gc)
	if !slices.Contains(gc.Kept, pinned) {
		t.Fatalf("gc removed the previous pin %s: %+v", pinned, gc)
	}
	out, code = c.run("gc", "--all", "--json")
	json.Unmarshal([]byte(out), &gc)
	if code != 0 || !slices.Contains(gc.Removed, pinned) {
		t.Fatalf("gc --all exit %d did not remove %s:\n%s", code, pinned, out)
	}
	out, code = c.run("run", "eng:2.0", "--", "true")
	if code != 1 || !strings.Contains(out, "has no pin") {
		t.Fatalf("run after unpin exit %d:\n%s", code, out)
	}
}

func TestCLISimulatedProvisionExitCodes(t *testing.T) {
	reg := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "eng", "3.0",
		[]sandbox.EngineVariant{{Name: "cu129", CUDA: "12.9", Archs: "9.0", SimProbe: "fail"}}); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/eng:3.0"
	c := newCLI(t, reg)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"probe fails", []string{"provision", ref}, 1, "FAILED"},
		{"override none", []string{"provision", "--override", "none", ref}, 3, "DISABLED"},
		{"bad override", []string{"provision", "--override", "Not A Variant!", ref}, 2, "accepted forms"},
		{"bad reference", []string{"provision", "UPPER/Case::x"}, 2, "reference"},
		{"unknown variant", []string{"provision", "--override", "cu99", ref}, 1, "no such variant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := c.run(tc.args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d (want %d), output lacks %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
	if pins, _ := testenv.Runtime(t).Pins(context.Background()); len(pins) != 0 {
		t.Fatalf("pins after failures: %+v", pins)
	}
}

// A forced variant that fails its probe keeps the earlier pin, and the
// output says so with that pin's own variant (issue 10, point 5: `make
// demo` printed the cu129 pin as "(cu13)"). The rejection lines do not
// repeat the variant either.
func TestCLISimulatedFailedForcedVariantPrintsTheEarlierPin(t *testing.T) {
	// On both registries: what is printed must not depend on the registry.
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			good := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "9.0"}
			bad := sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", Archs: "9.0", SimProbe: "fail"}
			if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "eng", "4.0", []sandbox.EngineVariant{good, bad}); err != nil {
				t.Fatal(err)
			}
			ref := reg.Host + "/eng:4.0"
			c := newCLI(t, nil)
			out, code := c.run("provision", ref, "--override", "cu129", "--json")
			var sts []provision.Status
			if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &sts); code != 0 || err != nil || len(sts) != 1 || sts[0].Variant != "cu129" {
				t.Fatalf("provision cu129: exit %d, %v:\n%s", code, err, out)
			}
			pinned := sts[0].Pinned

			// In JSON too: the variant beside the pinned reference is the pin's.
			out, code = c.run("provision", ref, "--override", "cu13", "--json")
			sts = nil
			if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &sts); code != 1 || err != nil || len(sts) != 1 {
				t.Fatalf("forced cu13 --json: exit %d, %v:\n%s", code, err, out)
			}
			if st := sts[0]; st.Pinned != pinned || st.Variant != "cu129" || st.Attempted != "cu13" {
				t.Fatalf("forced cu13 --json: pinned %s (%s), attempted %q; want %s (cu129), attempted cu13:\n%s", st.Pinned, st.Variant, st.Attempted, pinned, out)
			}

			out, code = c.run("provision", ref, "--override", "cu13")
			if code != 1 || !strings.Contains(out, "eng:4.0: FAILED") {
				t.Fatalf("forced cu13 with a failing probe: exit %d, want 1 and FAILED:\n%s", code, out)
			}
			want := "  pinned:   " + pinned + " (cu129)\n"
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q, the earlier pin with its own variant:\n%s", want, out)
			}
			if strings.Contains(out, pinned+" (cu13)") {
				t.Errorf("the cu129 pin is printed as cu13:\n%s", out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "cu13: cu13:") || strings.Contains(line, "cu129: cu129:") {
					t.Errorf("a line repeats the variant: %s", line)
				}
			}
			pins, err := testenv.Runtime(t).Pins(context.Background())
			if err != nil || len(pins) != 1 || pins[0].Ref != pinned || pins[0].Variant != "cu129" {
				t.Fatalf("pins after the failed forced variant: %+v, %v; want the cu129 pin kept", pins, err)
			}
		})
	}
}

// gpupin run never starts a record whose target was changed outside
// gpupin, by key or by reference: it exits 1 saying the record was
// tampered with, and the replica's command never runs.
func TestCLISimulatedRunRefusesATamperedRecord(t *testing.T) {
	reg := testenv.Registry(t)
	v := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "9.0"}
	for _, e := range []string{"eng", "other"} {
		if _, err := sandbox.PublishEngine(context.Background(), reg.Host, e, "5.0", []sandbox.EngineVariant{v}); err != nil {
			t.Fatal(err)
		}
	}
	c := newCLI(t, reg)
	out, code := c.run("provision", reg.Host+"/eng:5.0", reg.Host+"/other:5.0", "--json")
	var sts []provision.Status
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &sts); code != 0 || err != nil || len(sts) != 2 {
		t.Fatalf("provision: exit %d, %v:\n%s", code, err, out)
	}
	rt := testenv.Runtime(t)
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	is := rt.Client().ImageService()
	rec, err := is.Get(ctx, sts[0].Pinned)
	if err != nil {
		t.Fatal(err)
	}
	otherRec, err := is.Get(ctx, sts[1].Pinned)
	if err != nil {
		t.Fatal(err)
	}
	rec.Target = otherRec.Target // labels kept
	if _, err := is.Update(ctx, rec, "target"); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"eng:5.0", sts[0].Pinned, reg.Host + "/eng:5.0"} {
		out, code := c.run("run", target, "--", "/bin/sh", "-c", "echo REPLICA-RAN")
		if code != 1 || !strings.Contains(out, "tampered pin record") || strings.Contains(out, "REPLICA-RAN") {
			t.Errorf("run %s: exit %d; want 1, a tampered record refused, no replica:\n%s", target, code, out)
		}
	}
	// The untampered pin still runs.
	if out, code := c.run("run", "other:5.0", "--", "/bin/sh", "-c", "echo REPLICA-RAN"); code != 0 || !strings.Contains(out, "REPLICA-RAN") {
		t.Fatalf("run other:5.0: exit %d:\n%s", code, out)
	}
}

// --probe-memory and --probe-pids reach the probe's cgroup (memory+swap
// bounded to the memory), --provision-timeout ends a stuck provision with
// a reason that names it, and values that would mean no limit or no time
// are refused (exit 2) rather than silently replaced.
func TestCLISimulatedProbeLimitsAndProvisionTimeout(t *testing.T) {
	reg := testenv.Registry(t)
	hang := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "9.0", SimProbe: "hang"}
	if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "eng", "6.0", []sandbox.EngineVariant{hang}); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/eng:6.0"
	c := newCLI(t, reg)
	for _, tc := range []struct {
		flag, value, want string
	}{
		{"--probe-memory", "0", "the probe always has a memory limit"},
		{"--probe-memory", "0g", "the probe always has a memory limit"},
		{"--probe-pids", "0", "the probe always has a pids limit"},
		{"--provision-timeout", "0s", "want a positive duration"},
		{"--probe-timeout", "0s", "want a positive duration"},
	} {
		t.Run(tc.flag+"="+tc.value, func(t *testing.T) {
			out, code := c.run("provision", ref, tc.flag, tc.value)
			if code != 2 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 2 and %q:\n%s", code, tc.want, out)
			}
		})
	}

	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, code := c.run("provision", ref, "--probe-memory", "96m", "--probe-pids", "50", "--provision-timeout", "8s")
		done <- result{out, code}
	}()
	limits, err := testenv.ProbeCgroup(testenv.Runtime(t), 60*time.Second, func() bool { return len(done) > 0 })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(limits, " "), strings.Join(testenv.LimitLines(96<<20, 50), " "); got != want {
		t.Errorf("probe cgroup: %s; want %s", got, want)
	}
	r := <-done
	if r.code != 1 || !strings.Contains(r.out, "provision took longer than 8s (provision timeout)") {
		t.Fatalf("a hung probe under --provision-timeout 8s: exit %d, want 1 and the timeout named:\n%s", r.code, r.out)
	}
}

// Usage errors exit 2 through the real binary, as they do in process:
// urfave/cli's own exit handling once called os.Exit(3) for `help bogus`
// before main could map it (the in-process tests, with a handler of their
// own, never saw it). The message comes once, from main.
func TestCLIUsageErrorsExitTwoThroughTheBinary(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // on stderr
	}{
		{[]string{"help", "bogus"}, "gpupin: No help topic for 'bogus'"},
		{[]string{"nosuch"}, `gpupin: gpupin has no command "nosuch"`},
		{[]string{"override", "bogus"}, `gpupin: gpupin override has no command "bogus"`},
		{[]string{"plan", "reg.example/x:1", "--bogus"}, "gpupin: flag provided but not defined: -bogus"},
		{[]string{"gc", "--runc-root"}, "gpupin: flag provided but not defined: -runc-root"},
		{[]string{"--namespace"}, "gpupin: flag needs an argument: -namespace"},
		{[]string{"plan"}, "gpupin: usage: gpupin plan REF"},
		{[]string{"--overrides", "/nonexistent/overrides.yaml", "override", "set", "vllm", "off"}, `gpupin: override "off" is a YAML boolean, not an override; write none`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.Command(gpupinBin, tc.args...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2; stderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), tc.want) != 1 {
				t.Errorf("stderr lacks %q once:\n%s", tc.want, stderr.String())
			}
		})
	}
}

// An unknown --probe is a usage error (exit 2) before any registry is
// read, for every engine: vllm and sglang bring a probe of their own, so
// the library would never look at it, and for others it failed only after
// the registry had answered, with exit 1.
func TestCLIUnknownProbeIsAUsageErrorBeforeTheRegistry(t *testing.T) {
	reg := testenv.Registry(t)
	c := newCLI(t, reg)
	for _, cmd := range []string{"provision", "probe"} {
		for _, engine := range []string{"vllm", "sglang", "eng"} {
			t.Run(cmd+" "+engine, func(t *testing.T) {
				reg.Reset()
				out, code := c.run(cmd, reg.Host+"/"+engine+":1.0", "--probe", "bogus")
				if code != 2 || !strings.Contains(out, `--probe bogus: unknown probe "bogus"`) {
					t.Fatalf("exit %d (want 2), output:\n%s", code, out)
				}
				if reqs := reg.Requests(); len(reqs) != 0 {
					t.Fatalf("the registry was read before the flag was refused: %+v", reqs)
				}
			})
		}
	}
}

// CONTAINERD_NAMESPACE set but empty is the default namespace, not "":
// containerd refuses every call in namespace "" ("namespace is required").
func TestCLIEmptyNamespaceVariableIsTheDefault(t *testing.T) {
	d := testenv.Containerd(t)
	cmd := exec.Command(gpupinBin, "--address", d.Address, "--node", filepath.Join("..", "examples", "nodes", "h100-driver580.json"), "pins", "--json")
	cmd.Env = append(os.Environ(), "CONTAINERD_NAMESPACE=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpupin pins with CONTAINERD_NAMESPACE= : %v\n%s", err, out)
	}
	if strings.Contains(string(out), "namespace is required") {
		t.Fatalf("output:\n%s", out)
	}
}

// A gpupin built alone (`go build ./cmd/gpupin`, `go install`) has no probe
// programs beside it: a provision that needs one says, before it pulls
// anything, the exact command that puts them there, and that command
// works.
func TestCLISimulatedProbeProgramsMissingSaysHowBeforeThePull(t *testing.T) {
	reg := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "eng", "5.0",
		[]sandbox.EngineVariant{{Name: "cu129", CUDA: "12.9", Archs: "9.0"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/usr/lib/gpupin/" + probe.CUDAProbeName); err == nil {
		t.Fatal("/usr/lib/gpupin holds the probe programs (a gpupin package is installed): gpupin would find them there; dpkg -P gpupin first")
	}
	alone := t.TempDir()
	bin := filepath.Join(alone, "gpupin")
	data, err := os.ReadFile(gpupinBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t, reg)
	provision := func() (string, int) {
		args := append(append([]string{}, c.base...), "provision", reg.Host+"/eng:5.0",
			"--runc-root", testenv.Containerd(t).RuncRoot, "--probe-dir", filepath.Join(c.dir, "probe"))
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), probe.EnvLibDir+"=")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	reg.Reset()
	out, code := provision()
	hint := "`CGO_ENABLED=0 go build -o " + alone + "/ ./cmd/gpupin-cuda-probe ./cmd/gpupin-sim-probe`"
	if code != 1 || !strings.Contains(out, "no gpupin-cuda-probe binary") || !strings.Contains(out, hint) {
		t.Fatalf("exit %d (want 1), output lacks %s:\n%s", code, hint, out)
	}
	if n := reg.Count("blob", ""); n != 0 {
		t.Fatalf("%d blob requests before the missing probe was said", n)
	}

	// The command as printed, run in the checkout, and the provision passes.
	build := exec.Command("/bin/sh", "-c", strings.Trim(hint, "`"))
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", hint, err, out)
	}
	if out, code := provision(); code != 0 {
		t.Fatalf("provision after the probes were built: exit %d\n%s", code, out)
	}
}
