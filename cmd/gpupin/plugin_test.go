package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/internal/kubetest"
)

// kubectl gpupin ARGS is gpupin fleet ARGS, unless ARGS names a command.
func TestPluginArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"bare", []string{"kubectl-gpupin"}, []string{"kubectl-gpupin", "fleet"}},
		{"a full path, as kubectl runs it", []string{"/usr/bin/kubectl-gpupin"}, []string{"/usr/bin/kubectl-gpupin", "fleet"}},
		{"fleet's flags", []string{"kubectl-gpupin", "--kubeconfig", "kc", "--json"}, []string{"kubectl-gpupin", "fleet", "--kubeconfig", "kc", "--json"}},
		{"global flags first", []string{"kubectl-gpupin", "--log-level", "debug", "--json"}, []string{"kubectl-gpupin", "--log-level", "debug", "--json", "fleet"}},
		{"global flags before a command", []string{"kubectl-gpupin", "--log-level=debug", "plan", "REF"}, []string{"kubectl-gpupin", "--log-level=debug", "plan", "REF"}},
		{"fleet named", []string{"kubectl-gpupin", "fleet", "--json"}, []string{"kubectl-gpupin", "fleet", "--json"}},
		{"another command", []string{"kubectl-gpupin", "plan", "REF", "--node-name", "gpu-07"}, []string{"kubectl-gpupin", "plan", "REF", "--node-name", "gpu-07"}},
		{"help", []string{"kubectl-gpupin", "--help"}, []string{"kubectl-gpupin", "--help"}},
		{"help after a global flag", []string{"kubectl-gpupin", "--json", "-h"}, []string{"kubectl-gpupin", "--json", "-h"}},
		{"no such command: refused as one", []string{"kubectl-gpupin", "nosuch"}, []string{"kubectl-gpupin", "nosuch"}},
		{"a global flag's value missing", []string{"kubectl-gpupin", "--log-level"}, []string{"kubectl-gpupin", "--log-level"}},
		{"after --", []string{"kubectl-gpupin", "--", "x"}, []string{"kubectl-gpupin", "fleet", "--", "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pluginArgs(newApp(), tc.args); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("pluginArgs(%q) = %q, want %q", tc.args, got, tc.want)
			}
		})
	}
}

// pluginRun runs the app in-process as kubectl-gpupin ARGS would.
func pluginRun(args ...string) (stdout, errMsg string, code int) {
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	app = asPlugin(app)
	errMsg, code = execute(context.Background(), app, pluginArgs(app, append([]string{pluginName}, args...)))
	return out.String() + errOut.String(), errMsg, code
}

// The help and the errors name kubectl gpupin.
func TestPluginHelpNamesKubectlGpupin(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"--help"}, exitOK, []string{"kubectl gpupin - gpupin as a kubectl plugin", "kubectl gpupin [--kubeconfig FILE]", "fleet", "plan"}},
		{[]string{"fleet", "--help"}, exitOK, []string{"kubectl gpupin [fleet] [--kubeconfig FILE] [--json]"}},
		{[]string{"plan", "--help"}, exitOK, []string{"kubectl gpupin plan REF"}},
		{[]string{"nosuch"}, exitUsage, []string{`kubectl gpupin has no command "nosuch" (see kubectl gpupin --help)`}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, msg, code := pluginRun(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d (%s), want %d:\n%s", code, msg, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out+msg, w) {
					t.Errorf("lacks %q:\n%s%s", w, out, msg)
				}
			}
		})
	}
}

// The gpupin binary, run through a kubectl-gpupin symlink (as the
// packages install it), prints the fleet's table from a real API server;
// and so does `kubectl gpupin` (kubectl finds the link on PATH).
func TestKubectlPluginBinary(t *testing.T) {
	c := kubetest.StartT(t, fleetManifests)
	kc, err := c.Kubeconfig(kubetest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Admin())
	if err != nil {
		t.Fatal(err)
	}
	putStatus(t, dyn, "h100-a", fleet.NodeStatus{Driver: "580.82.07", CUDA: "13.0", GPUs: []string{"NVIDIA H100"}, Simulated: true,
		Engines: []fleet.EngineStatus{{Key: "vllm:0.11.0", State: "ready", Variant: "cu13", At: metav1.Now()}}})

	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "gpupin"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	plugin := filepath.Join(dir, pluginName)
	if err := os.Symlink("gpupin", plugin); err != nil {
		t.Fatal(err)
	}
	run := func(name string, env []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s: %v", name, err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	table := []string{"h100-a (SIMULATED)", "ready/cu13", "NVIDIA H100  580.82.07  cu13     1       0       -"}
	want := func(what, out string, code int, wants ...string) {
		t.Helper()
		if code != exitOK {
			t.Fatalf("%s: exit %d:\n%s", what, code, out)
		}
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s lacks %q:\n%s", what, w, out)
			}
		}
	}
	out, code := run(plugin, nil, "--kubeconfig", kc)
	want("kubectl-gpupin --kubeconfig", out, code, table...)
	out, code = run(plugin, []string{"KUBECONFIG=" + kc}, "--json")
	var js struct {
		Nodes []fleet.GPUPinNode `json:"nodes"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &js) != nil || len(js.Nodes) != 1 {
		t.Fatalf("kubectl-gpupin --json: exit %d\n%s", code, out)
	}
	out, code = run(plugin, nil, "--help")
	want("kubectl-gpupin --help", out, code, "kubectl gpupin [--kubeconfig FILE] [--json]")
	if out, code = run(plugin, nil, "nosuch"); code != exitUsage || !strings.Contains(out, `kubectl gpupin: kubectl gpupin has no command "nosuch"`) {
		t.Errorf("kubectl-gpupin nosuch: exit %d:\n%s", code, out)
	}
	// The binary under its own name is still gpupin.
	if out, code = run(filepath.Join(dir, "gpupin"), nil, "--kubeconfig", kc); code != exitUsage || !strings.Contains(out, "gpupin: flag provided but not defined: -kubeconfig") {
		t.Errorf("gpupin --kubeconfig: exit %d:\n%s", code, out)
	}

	// scripts/deps.sh test installs one (Debian's kubernetes-client).
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("no kubectl on PATH (scripts/deps.sh test installs it): %v", err)
	}
	out, code = run(kubectl, []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"), "KUBECONFIG=" + kc}, "gpupin")
	t.Logf("kubectl gpupin:\n%s", out)
	want("kubectl gpupin", out, code, table...)
}

// putStatus makes a GPUPinNode with st, as a node's agent writes it.
func putStatus(t *testing.T, dyn dynamic.Interface, name string, st fleet.NodeStatus) {
	t.Helper()
	ctx := context.Background()
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("gpupin.io/v1alpha1")
	obj.SetKind("GPUPinNode")
	obj.SetName(name)
	got, err := dyn.Resource(fleet.GPUPinNodes).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(fleet.GPUPinNode{Status: st})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	got.Object["status"] = m["status"]
	if _, err := dyn.Resource(fleet.GPUPinNodes).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
