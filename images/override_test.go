package images

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseOverride(t *testing.T) {
	tests := []struct {
		in      string
		kind    OverrideKind
		str     string
		wantErr string
	}{
		{in: "", kind: OverrideAuto, str: "auto"},
		{in: "auto", kind: OverrideAuto, str: "auto"},
		{in: " none ", kind: OverrideNone, str: "none"},
		{in: "cu129", kind: OverrideVariant, str: "cu129"},
		{in: "cu128-sm90", kind: OverrideVariant, str: "cu128-sm90"},
		{in: "registry.example/org/vllm:0.11.0-custom", kind: OverrideImage, str: "registry.example/org/vllm:0.11.0-custom"},
		{in: "127.0.0.1:5000/vllm@sha256:" + strings.Repeat("a", 64), kind: OverrideImage, str: "127.0.0.1:5000/vllm@sha256:" + strings.Repeat("a", 64)},
		{in: "vllm:latest", kind: OverrideImage, str: "vllm:latest"},
		{in: "Auto", wantErr: "accepted forms"},
		{in: "cu 129", wantErr: "accepted forms"},
		{in: "CU129", wantErr: "not a variant name"},
		{in: "registry.example/Org/vllm:1", wantErr: "accepted forms"},
		{in: "reg/vllm@sha256:abc", wantErr: "accepted forms"},
		{in: "reg/vllm:", wantErr: "accepted forms"},
		{in: strings.Repeat("a", 600), wantErr: "too long"},
	}
	for _, tc := range tests {
		o, err := ParseOverride(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseOverride(%q) = %+v, %v; want error %q", tc.in, o, err, tc.wantErr)
			}
			continue
		}
		if err != nil || o.Kind != tc.kind || o.String() != tc.str {
			t.Errorf("ParseOverride(%q) = %+v (%q), %v; want %s %q", tc.in, o, o.String(), err, tc.kind, tc.str)
		}
	}
}

func TestOverrideFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "gpupin") // parent does not exist yet
	path := filepath.Join(dir, "overrides.yaml")

	of, err := LoadOverrides(path)
	if err != nil || len(of.Overrides) != 0 {
		t.Fatalf("missing file: %+v, %v; want empty", of, err)
	}
	if o, set := of.Get("vllm"); set || o.Kind != OverrideAuto {
		t.Fatalf("Get on empty = %+v, %v; want auto, unset", o, set)
	}
	for engine, value := range map[string]string{"vllm": "cu129", "sglang": "none", "llama.cpp": "registry.example/org/llama:b1-cu13"} {
		if _, err := of.Set(engine, value); err != nil {
			t.Fatalf("Set(%s, %s): %v", engine, value, err)
		}
	}
	if err := of.Save(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("stat: %v, mode %v; want 0644", err, st.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temp files left)", len(entries))
	}

	back, err := LoadOverrides(path)
	if err != nil {
		t.Fatal(err)
	}
	if o, set := back.Get("vllm"); !set || o.Kind != OverrideVariant || o.Variant != "cu129" {
		t.Errorf("vllm = %+v, %v", o, set)
	}
	if o, _ := back.Get("sglang"); o.Kind != OverrideNone {
		t.Errorf("sglang = %+v", o)
	}
	if o, _ := back.Get("llama.cpp"); o.Kind != OverrideImage || o.Image != "registry.example/org/llama:b1-cu13" {
		t.Errorf("llama.cpp = %+v", o)
	}
	if got := strings.Join(back.Engines(), ","); got != "llama.cpp,sglang,vllm" {
		t.Errorf("Engines = %s", got)
	}

	// A mode the operator chose survives a rewrite.
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if !back.Clear("sglang") || back.Clear("sglang") {
		t.Error("Clear should report true once, then false")
	}
	if err := back.Save(); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode after rewrite = %v, want 0600 kept", st.Mode().Perm())
	}
	again, err := LoadOverrides(path)
	if err != nil || len(again.Overrides) != 2 {
		t.Errorf("after clear: %+v, %v; want 2 overrides", again, err)
	}
}

func TestOverrideFileRefuses(t *testing.T) {
	of := &OverrideFile{Path: filepath.Join(t.TempDir(), "o.yaml")}
	for _, tc := range []struct{ engine, value, want string }{
		{"vllm", "CU129", "accepted forms"},
		{"vllm", "reg/x:", "accepted forms"},
		{"VLLM", "cu129", "not an engine name"},
		{"a/b", "cu129", "not an engine name"},
	} {
		if _, err := of.Set(tc.engine, tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Set(%q, %q) = %v, want %q", tc.engine, tc.value, err, tc.want)
		}
	}
	if len(of.Overrides) != 0 {
		t.Errorf("refused values were recorded: %v", of.Overrides)
	}

	// A file in the wrong shape is told so in YAML's words (a mapping, a
	// list, a string) and with the shape wanted, never in the JSON
	// decoder's ("error unmarshaling JSON", "Go struct field").
	const shape = "want a mapping whose one key, overrides, maps each engine to its override"
	bad := []struct {
		name, body string
		want       []string
	}{
		{"bad value", "overrides:\n  vllm: CU13\n", []string{"engine vllm"}},
		{"bad engine", "overrides:\n  Bad/Engine: cu13\n", []string{"not an engine name"}},
		{"misspelt key", "overides:\n  vllm: cu13\n", []string{"parse overrides", `unknown key "overides" at the top`, shape}},
		{"not yaml", "overrides: [unclosed\n", []string{"parse overrides", "not YAML: ", "line 1", shape}},
		{"value not a string", "overrides:\n  vllm: [cu13]\n", []string{"parse overrides", "engine vllm: its override is a list", "want one value: auto, none"}},
		{"value a mapping", "overrides:\n  vllm:\n    variant: cu13\n", []string{"engine vllm: its override is a mapping"}},
		{"overrides a list", "overrides:\n  - vllm: cu13\n", []string{"overrides is a list", shape}},
		{"overrides a string", "overrides: cu13\n", []string{"overrides is a string", shape}},
		{"the file a list", "- vllm: cu13\n", []string{"the file is a list", shape}},
		{"an engine twice", "overrides:\n  vllm: cu13\n  vllm: cu129\n", []string{`key "vllm" already set`}},
	}
	for _, tc := range bad {
		path := filepath.Join(t.TempDir(), "o.yaml")
		if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOverrides(path)
		if err == nil {
			t.Errorf("%s: LoadOverrides took %q", tc.name, tc.body)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: LoadOverrides = %v, want %q", tc.name, err, w)
			}
		}
		for _, no := range []string{"JSON", "json", "Go struct", "Go value", "map[string]string"} {
			if strings.Contains(err.Error(), no) {
				t.Errorf("%s: the error speaks of %q: %v", tc.name, no, err)
			}
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: the error does not name the file: %v", tc.name, err)
		}
	}
	// A file the hand wrote in flow style reads.
	path := filepath.Join(t.TempDir(), "o.yaml")
	os.WriteFile(path, []byte("overrides: {vllm: cu129, sglang: none}\n"), 0o644)
	of2, err := LoadOverrides(path)
	if err != nil || of2.Overrides["vllm"] != "cu129" || of2.Overrides["sglang"] != "none" {
		t.Errorf("flow style: %+v, %v", of2, err)
	}
}

// Writers at once (the CLI and the agent) lose none of each other's changes.
func TestUpdateOverridesConcurrentWritersLoseNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etc", "overrides.yaml")
	const n = 16
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			_, err := UpdateOverrides(path, func(of *OverrideFile) error {
				_, err := of.Set(fmt.Sprintf("engine%d", i), "cu129")
				return err
			})
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	of, err := LoadOverrides(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(of.Overrides) != n {
		t.Fatalf("%d of %d overrides survived: %v", len(of.Overrides), n, of.Overrides)
	}
	// A refused change writes nothing.
	if _, err := UpdateOverrides(path, func(of *OverrideFile) error { _, err := of.Set("engine0", "Bad Value"); return err }); err == nil {
		t.Fatal("a bad value was accepted")
	}
	if of, _ := LoadOverrides(path); of.Overrides["engine0"] != "cu129" {
		t.Fatalf("engine0 = %q after a refused change", of.Overrides["engine0"])
	}
}

// YAML booleans are never overrides: `vllm: off` reaches the decoder as
// the string "false" (YAML 1.1), `vllm: true` as "true", and either would
// otherwise be taken for a variant of that name and fail only later, as
// "no such variant". The file is refused with the value as written, its
// line, and what to write instead; so is the string, quoted or given to
// ParseOverride (the CLI, the agent's API).
func TestOverrideYAMLBooleansRefused(t *testing.T) {
	const hint = "write none to keep the engine off this node, or auto to let gpupin choose by driver and GPUs"
	for _, tc := range []struct {
		name, body string
		want       string // the whole message after the file's name
	}{
		{"true", "overrides:\n  vllm: true\n", "line 2: engine vllm: true is a YAML boolean (true/false), not an override; " + hint},
		{"false", "overrides:\n  sglang: none\n  vllm: false\n", "line 3: engine vllm: false is a YAML boolean (true/false), not an override; " + hint},
		{"off", "overrides:\n  vllm: off\n", "line 2: engine vllm: off is a YAML boolean (true/false), not an override; " + hint},
		{"on", "overrides:\n  vllm: on\n", "line 2: engine vllm: on is a YAML boolean (true/false), not an override; " + hint},
		{"yes", "overrides:\n  vllm: yes\n", "line 2: engine vllm: yes is a YAML boolean (true/false), not an override; " + hint},
		{"no", "overrides:\n  vllm: no\n", "line 2: engine vllm: no is a YAML boolean (true/false), not an override; " + hint},
		{"capitalised", "overrides:\n  vllm: Off\n", "line 2: engine vllm: Off is a YAML boolean (true/false), not an override; " + hint},
		{"flow style", "overrides: {vllm: TRUE}\n", "line 1: engine vllm: TRUE is a YAML boolean (true/false), not an override; " + hint},
		{"quoted", "overrides:\n  vllm: 'off'\n", `engine vllm: override "off" is a YAML boolean, not an override; ` + hint},
		{"quoted true", "overrides:\n  vllm: \"true\"\n", `engine vllm: override "true" is a YAML boolean, not an override; ` + hint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "o.yaml")
			if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			of, err := LoadOverrides(path)
			if want := "overrides " + path + ": " + tc.want; err == nil || err.Error() != want {
				t.Fatalf("LoadOverrides = %+v, %v\nwant error %s", of, err, want)
			}
		})
	}
	for _, s := range []string{"true", "false", "off", "on", "yes", "no", "y", "n", "OFF", "True"} {
		if o, err := ParseOverride(s); err == nil || !strings.Contains(err.Error(), "is a YAML boolean, not an override; "+hint) {
			t.Errorf("ParseOverride(%q) = %+v, %v; want the YAML boolean refusal", s, o, err)
		}
	}
	// Words that merely begin like one are variant names as before.
	for _, s := range []string{"none", "auto", "offload", "yes2", "cu129"} {
		if _, err := ParseOverride(s); err != nil {
			t.Errorf("ParseOverride(%q): %v", s, err)
		}
	}
}

// SetOverride refuses bad input as a *Refusal (the CLI's usage error, the
// API's 400) and leaves the file as it was; a file that is bad on disk is
// the file's fault, an error of another kind, whatever the input.
func TestSetOverrideRefusals(t *testing.T) {
	cases := []struct {
		name, file, engine, value string
		refused, fails            bool
	}{
		{name: "set", engine: "vllm", value: "cu129"},
		{name: "bad engine", engine: "VLLM", value: "cu129", refused: true},
		{name: "bad value", engine: "vllm", value: "off", refused: true},
		{name: "bad file", file: "overrides:\n  Bad_Engine: cu129\n", engine: "vllm", value: "cu129", fails: true},
		{name: "bad value in file", file: "overrides:\n  sglang: \"-x\"\n", engine: "vllm", value: "cu129", fails: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "overrides.yaml")
			if tc.file != "" {
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			o, of, err := SetOverride(path, tc.engine, tc.value)
			var refused *Refusal
			if got := errors.As(err, &refused); got != tc.refused {
				t.Errorf("refusal = %v (%v), want %v", got, err, tc.refused)
			}
			if (err != nil) != (tc.refused || tc.fails) {
				t.Fatalf("err = %v", err)
			}
			after, _ := os.ReadFile(path)
			if err != nil {
				if string(after) != tc.file {
					t.Errorf("the file changed on an error: %q", after)
				}
				return
			}
			if o.String() != tc.value || of.Overrides[tc.engine] != tc.value {
				t.Errorf("set %s = %v (file %v)", tc.engine, o, of.Overrides)
			}
		})
	}
}
