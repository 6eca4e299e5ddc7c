package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/internal/sandbox"
)

// choiceRun runs the app in-process, as `gpupin ARGS…` would, and returns
// its stdout, the error message main would print, and the exit code.
func choiceRun(t *testing.T, args ...string) (stdout, errMsg string, code int) {
	t.Helper()
	app := newApp()
	var out, errOut bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errOut
	// main's own path: the app's ExitErrHandler keeps urfave/cli from
	// exiting, and execute maps the error to the code main exits with.
	errMsg, code = execute(context.Background(), app, append([]string{"gpupin"}, args...))
	return out.String(), errMsg, code
}

// choiceWorld is a registry holding the test engines and node-facts files.
type choiceWorld struct {
	reg                    *sandbox.Registry
	engine, derived, image string
	dir                    string
}

func newChoiceWorld(t *testing.T) *choiceWorld {
	t.Helper()
	ctx := context.Background()
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	w := &choiceWorld{reg: reg, dir: t.TempDir(),
		engine: reg.Host + "/vllm:0.11.0", derived: reg.Host + "/vllm/vllm-openai:v0.20.0", image: reg.Host + "/myorg/vllm-custom:1"}
	cu13 := sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", Archs: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"}
	cu129 := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "7.0,7.5,8.0,8.6,8.9,9.0"}
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "vllm", "0.11.0", []sandbox.EngineVariant{cu129, cu13}); err != nil {
		t.Fatal(err)
	}
	d13 := sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", NoAnnotations: true, Env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=tesla,driver>=570,driver<571"}}
	d129 := sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", NoAnnotations: true, Env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.9 brand=tesla,driver>=535,driver<536"}}
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "vllm/vllm-openai", "v0.20.0", []sandbox.EngineVariant{d13, d129}); err != nil {
		t.Fatal(err)
	}
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.8.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.PushImage(ctx, w.image, img); err != nil {
		t.Fatal(err)
	}
	return w
}

// nodeFile writes node facts, the JSON `detect --json` prints.
func (w *choiceWorld) nodeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(w.dir, name+".json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	factsH100on580 = `{"driver":"580.82.07","cuda":"13.0","platform":"linux/amd64","gpus":[{"index":0,"uuid":"GPU-1","name":"NVIDIA H100 80GB HBM3","brand":"nvidia","cc":"9.0","memory_mib":81559}]}`
	factsH100on575 = `{"driver":"575.57.08","cuda":"12.9","gpus":[{"index":0,"uuid":"GPU-1","name":"NVIDIA H100 80GB HBM3","brand":"nvidia","cc":"9.0","memory_mib":81559}]}`
	factsNoDriver  = `{"unsupported":"no NVIDIA driver (NVML init: ERROR_LIBRARY_NOT_FOUND (12))"}`
)

func keysOf(m map[string]any) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

func TestPlanJSONSimulated(t *testing.T) {
	w := newChoiceWorld(t)
	h580 := w.nodeFile(t, "h580", factsH100on580)
	ovPath := filepath.Join(w.dir, "none.yaml")
	out, msg, code := choiceRun(t, "--overrides", ovPath, "plan", w.engine, "--node", h580, "--json")
	if code != exitOK {
		t.Fatalf("exit %d (%s): %s", code, msg, out)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("plan --json is not JSON: %v\n%s", err, out)
	}
	// The shape scripts rely on (issue 2), and what the one decision
	// (provision.Plan) adds: the pin key, how it was named, where the
	// override came from.
	if got := keysOf(p); got != "candidates,derived,engine,key,named_by,node,outcome,override,override_from,ref,rejected,simulated,source,version" {
		t.Errorf("plan keys = %s", got)
	}
	if p["ref"] != w.engine || p["simulated"] != true || p["override"] != "auto" || p["outcome"] != "ready-to-provision" {
		t.Errorf("plan = %v", p)
	}
	cands := p["candidates"].([]any)
	if len(cands) != 2 {
		t.Fatalf("candidates = %v", cands)
	}
	first := cands[0].(map[string]any)
	if got := keysOf(first); got != "cuda,derived,media_type,platform,probe,ref,variant" {
		t.Errorf("candidate keys = %s", got)
	}
	if first["variant"] != "cu13" || first["cuda"] != "13.0" || first["platform"] != "linux/amd64" || first["derived"] != false || first["probe"] != "cuda" ||
		!strings.HasPrefix(first["ref"].(string), w.reg.Host+"/vllm@sha256:") {
		t.Errorf("first candidate = %v", first)
	}
	if cands[1].(map[string]any)["variant"] != "cu129" {
		t.Errorf("second candidate = %v", cands[1])
	}
	if rej := p["rejected"].([]any); len(rej) != 0 {
		t.Errorf("rejected = %v, want []", rej)
	}
	nodeJSON := p["node"].(map[string]any)
	if nodeJSON["driver"] != "580.82.07" || nodeJSON["simulated"] != true {
		t.Errorf("node = %v", nodeJSON)
	}
}

func TestPlanCasesSimulated(t *testing.T) {
	w := newChoiceWorld(t)
	h580 := w.nodeFile(t, "h580", factsH100on580)
	h575 := w.nodeFile(t, "h575", factsH100on575)
	nodrv := w.nodeFile(t, "nodrv", factsNoDriver)
	ovFile := func(body string) string {
		p := filepath.Join(t.TempDir(), "overrides.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := filepath.Join(w.dir, "absent.yaml")
	tests := []struct {
		name    string
		args    []string
		code    int
		out     []string // substrings of stdout
		notOut  []string
		errText string // substring of the error message
	}{
		{name: "human form on driver 575", args: []string{"--overrides", empty, "plan", w.engine, "--node", h575},
			code: exitOK, out: []string{
				"SIMULATED", "plan for " + w.engine + " (override: auto, from default)",
				"node: driver 575.57.08, CUDA 12.9, " + "linux/amd64", "0 NVIDIA H100 80GB HBM3 (cc 9.0)",
				"candidates, in the order they would be tried:", "1. cu129",
				"rejected:", "  cu13: driver 575.57.08 supports CUDA 12.9; this variant needs 13.0: upgrade the driver or use a variant built for CUDA ≤ 12.9\n",
				"outcome: ready-to-provision"},
			notOut: []string{"DERIVED", "2. ", "cu13: cu13:"}},
		{name: "global --node before the command", args: []string{"--node", h580, "--overrides", empty, "plan", w.engine},
			code: exitOK, out: []string{"SIMULATED", "1. cu13", "2. cu129"}},
		{name: "--override none", args: []string{"--overrides", empty, "plan", w.engine, "--node", h580, "--override", "none"},
			code: exitNoResult, out: []string{"(override: none, from --override)", "outcome: none"}},
		{name: "--override variant", args: []string{"--overrides", empty, "plan", "--override=cu129", w.engine, "--node", h580},
			code: exitOK, out: []string{"(override: cu129, from --override)", "1. cu129"}, notOut: []string{"2. "}},
		{name: "--override missing variant", args: []string{"--overrides", empty, "plan", w.engine, "--node", h580, "--override", "cu118"},
			code: exitNoResult, out: []string{"outcome: no-candidate", "published: cu129, cu13"}},
		{name: "--override image", args: []string{"--overrides", empty, "plan", w.engine, "--node", h580, "--override", w.image},
			code: exitOK, out: []string{"plan for " + w.engine, "1. cu128", w.reg.Host + "/myorg/vllm-custom@sha256:", "(derived)", "DERIVED"}},
		{name: "overrides file, by engine annotation", args: []string{"--overrides", ovFile("overrides: {vllm: cu129}\n"), "plan", w.engine, "--node", h580},
			code: exitOK, out: []string{"(override: cu129, from the overrides file)", "pin key: vllm:0.11.0 (named by the metadata)", "1. cu129"}, notOut: []string{"2. "}},
		{name: "overrides file: none", args: []string{"--overrides", ovFile("overrides: {vllm: none}\n"), "plan", w.engine, "--node", h580},
			code: exitNoResult, out: []string{"outcome: none"}},
		{name: "overrides file, engine from the repository", args: []string{"--overrides", ovFile("overrides: {vllm-openai: cu129}\n"), "plan", w.derived, "--node", h580},
			code: exitOK, out: []string{"(override: cu129, from the overrides file)", "pin key: vllm-openai:v0.20.0 (named by the reference)", "DERIVED", "1. cu129"}, notOut: []string{"2. "}},
		{name: "--override beats the file", args: []string{"--overrides", ovFile("overrides: {vllm: none}\n"), "plan", w.engine, "--node", h580, "--override", "auto"},
			code: exitOK, out: []string{"1. cu13"}},
		{name: "overrides file: image", args: []string{"--overrides", ovFile("overrides:\n  vllm: " + w.image + "\n"), "plan", w.engine, "--node", h580},
			code: exitOK, out: []string{"1. cu128"}},
		{name: "derived metadata is said", args: []string{"--overrides", empty, "plan", w.derived, "--node", h575},
			// Named vllm-openai by its repository, of the vllm family: the
			// torch probe, as provision and gpupin probe will run.
			code: exitOK, out: []string{"DERIVED", "1. cu129", "torch probe  (derived)", "  cu13: driver 575.57.08 supports CUDA 12.9; NVIDIA_REQUIRE_CUDA needs cuda>=13.0"},
			notOut: []string{"cu13: cu13:"}},
		{name: "unsupported node", args: []string{"--overrides", empty, "plan", w.engine, "--node", nodrv},
			code: exitNoResult, out: []string{"SIMULATED", "unsupported: no NVIDIA driver (", "outcome: unsupported"}},
		{name: "no REF", args: []string{"plan", "--node", h580}, code: exitUsage, errText: "usage: gpupin plan REF"},
		{name: "two REFs", args: []string{"plan", w.engine, w.engine, "--node", h580}, code: exitUsage, errText: "usage"},
		{name: "bad --override", args: []string{"plan", w.engine, "--node", h580, "--override", "CU13"}, code: exitUsage, errText: "accepted forms"},
		{name: "unknown flag after REF", args: []string{"plan", w.engine, "--bogus"}, code: exitUsage, errText: "not defined"},
		{name: "bad node file", args: []string{"plan", w.engine, "--node", filepath.Join(w.dir, "missing.json")}, code: exitError, errText: "read node facts"},
		{name: "missing tag", args: []string{"--overrides", empty, "plan", w.reg.Host + "/vllm:9.9.9", "--node", h580}, code: exitError, errText: "resolve"},
		{name: "bad overrides file", args: []string{"--overrides", ovFile("overrides: {vllm: CU1}\n"), "plan", w.engine, "--node", h580}, code: exitError, errText: "engine vllm"},
		{name: "overrides file in the wrong shape", args: []string{"--overrides", ovFile("overrides:\n  - vllm: cu129\n"), "plan", w.engine, "--node", h580},
			code: exitError, errText: "overrides is a list (- ITEM lines, or [A, B]); want a mapping whose one key, overrides, maps each engine to its override"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, msg, code := choiceRun(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; error %q; stdout:\n%s", code, tc.code, msg, out)
			}
			for _, s := range tc.out {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tc.notOut {
				if strings.Contains(out, s) {
					t.Errorf("stdout has %q:\n%s", s, out)
				}
			}
			if !strings.Contains(msg, tc.errText) {
				t.Errorf("error %q, want it to contain %q", msg, tc.errText)
			}
		})
	}
}

func TestPlanUnsupportedJSONSimulated(t *testing.T) {
	w := newChoiceWorld(t)
	out, _, code := choiceRun(t, "plan", w.engine, "--json", "--node", w.nodeFile(t, "nodrv", factsNoDriver))
	var p map[string]any
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if code != exitNoResult || p["outcome"] != "unsupported" || p["simulated"] != true || len(p["candidates"].([]any)) != 0 {
		t.Errorf("exit %d, plan %v", code, p)
	}
}

// `gpupin plan` reads manifests only: the registry serves no blob at all for
// an annotated index, and never a layer.
func TestPlanFetchesNoLayerBlobSimulated(t *testing.T) {
	w := newChoiceWorld(t)
	h580 := w.nodeFile(t, "h580", factsH100on580)
	w.reg.Reset()
	if _, msg, code := choiceRun(t, "--overrides", filepath.Join(w.dir, "absent.yaml"), "plan", w.engine, "--node", h580); code != exitOK {
		t.Fatalf("exit %d: %s", code, msg)
	}
	if n := w.reg.Count("manifest", "GET"); n == 0 {
		t.Fatal("the registry saw no manifest GET: the plan did not come from it")
	}
	for _, q := range w.reg.Requests() {
		if q.Kind() == "blob" {
			t.Errorf("plan fetched a blob: %s %s", q.Method, q.Path)
		}
	}
}
