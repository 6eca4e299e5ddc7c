package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOverrideCommands(t *testing.T) {
	w := newChoiceWorld(t)
	path := filepath.Join(t.TempDir(), "etc", "gpupin", "overrides.yaml")
	ov := func(args ...string) []string { return append([]string{"--overrides", path, "override"}, args...) }
	steps := []struct {
		name    string
		args    []string
		code    int
		out     []string
		errText string
	}{
		{"list when no file", ov("list"), exitOK, []string{"no overrides in " + path + ": every engine is auto"}, ""},
		{"get unset", ov("get", "vllm"), exitOK, []string{"auto (not set in"}, ""},
		{"set variant", ov("set", "vllm", "cu129"), exitOK, []string{"vllm: cu129 (variant), in " + path}, ""},
		{"set none", ov("set", "sglang", "none"), exitOK, []string{"sglang: none (none)"}, ""},
		{"set image", ov("set", "llama.cpp", "registry.example/org/llama:b1-cu13"), exitOK, []string{"(image)"}, ""},
		{"get set", ov("get", "vllm"), exitOK, []string{"cu129\n"}, ""},
		{"get JSON", ov("get", "vllm", "--json"), exitOK, []string{`"override": "cu129"`, `"kind": "variant"`, `"set": true`}, ""},
		{"list", ov("list"), exitOK, []string{"llama.cpp\tregistry.example/org/llama:b1-cu13\nsglang\tnone\nvllm\tcu129\n"}, ""},
		{"unknown form refused", ov("set", "vllm", "CU13!"), exitUsage, nil, `accepted forms: "auto"`},
		{"malformed reference refused", ov("set", "vllm", "reg/vllm:"), exitUsage, nil, "accepted forms"},
		{"bad engine refused", ov("set", "vLLM", "cu129"), exitUsage, nil, "not an engine name"},
		{"variant not published under --ref", ov("set", "vllm", "cu118", "--ref", w.engine), exitUsage, nil, "variant cu118 is not published under " + w.engine + "; published: cu129, cu13"},
		{"variant published under --ref", ov("set", "vllm", "cu13", "--ref", w.engine), exitOK, []string{"vllm: cu13 (variant)"}, ""},
		{"--ref of another engine", ov("set", "sglang", "cu13", "--ref", w.engine), exitUsage, nil, "--ref: " + w.engine + " is engine vllm (named by its io.gpupin.engine metadata), not sglang"},
		// No metadata names it: provision names it by its repository, and
		// an override filed under another name would never apply to it.
		{"--ref named by its repository", ov("set", "vllm", "cu129", "--ref", w.derived), exitUsage, nil, "--ref: " + w.derived + " is engine vllm-openai (named by its repository's last element), not vllm"},
		{"--ref under its repository's name", ov("set", "vllm-openai", "cu129", "--ref", w.derived), exitOK, []string{"vllm-openai: cu129 (variant)"}, ""},
		{"clear it again", ov("clear", "vllm-openai"), exitOK, []string{"vllm-openai: cleared, now auto"}, ""},
		{"--ref unreachable", ov("set", "vllm", "cu13", "--ref", w.reg.Host+"/vllm:0.0.0"), exitError, nil, "--ref"},
		{"clear", ov("clear", "sglang"), exitOK, []string{"sglang: cleared, now auto"}, ""},
		{"clear again", ov("clear", "sglang"), exitOK, []string{"sglang: no override was set"}, ""},
		{"set without value", ov("set", "vllm"), exitUsage, nil, "usage: gpupin override set ENGINE VALUE"},
	}
	for _, s := range steps {
		out, msg, code := choiceRun(t, s.args...)
		if code != s.code {
			t.Fatalf("%s: exit %d, want %d (%s):\n%s", s.name, code, s.code, msg, out)
		}
		for _, want := range s.out {
			if !strings.Contains(out, want) {
				t.Errorf("%s: stdout lacks %q:\n%s", s.name, want, out)
			}
		}
		if !strings.Contains(msg, s.errText) {
			t.Errorf("%s: error %q, want %q", s.name, msg, s.errText)
		}
	}

	// What the steps left: refused values never reached the file.
	out, _, code := choiceRun(t, "--overrides", path, "override", "list", "--json")
	var got struct {
		File      string            `json:"file"`
		Overrides map[string]string `json:"overrides"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitOK {
		t.Fatalf("list --json: exit %d, %v:\n%s", code, err, out)
	}
	want := map[string]string{"vllm": "cu13", "llama.cpp": "registry.example/org/llama:b1-cu13"}
	if got.File != path || len(got.Overrides) != len(want) {
		t.Fatalf("list --json = %+v, want %v", got, want)
	}
	for k, v := range want {
		if got.Overrides[k] != v {
			t.Errorf("override %s = %q, want %q", k, got.Overrides[k], v)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("overrides file: %v, mode %v; want 0644", err, st.Mode())
	}
	// And plan reads it.
	h580 := w.nodeFile(t, "h580", factsH100on580)
	out, msg, code := choiceRun(t, "--overrides", path, "plan", w.engine, "--node", h580)
	if code != exitOK || !strings.Contains(out, "(override: cu13, from the overrides file)") || strings.Contains(out, "2. ") {
		t.Errorf("plan after override set: exit %d (%s):\n%s", code, msg, out)
	}
}
