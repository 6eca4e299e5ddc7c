package agent_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/agent"
)

// The agent's config keeps overrides as the overrides file does, and
// refuses YAML booleans the same way: `vllm: off` would otherwise be the
// variant "false".
func TestConfigRefusesYAMLBooleanOverrides(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"overrides:\n  vllm: off\n", "overrides: line 2: engine vllm: off is a YAML boolean (true/false), not an override; write none"},
		{"wants:\n  - ref: reg.example/vllm:1\noverrides:\n  vllm: true\n", "overrides: line 4: engine vllm: true is a YAML boolean"},
		{"wants:\n  - ref: reg.example/vllm:1\n    override: \"no\"\n", `override "no" is a YAML boolean, not an override`},
	} {
		cfg, err := agent.ParseConfig([]byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %+v, %v; want %q", tc.body, cfg, err, tc.want)
		}
	}
	if _, err := agent.ParseConfig([]byte("overrides:\n  vllm: none\n  sglang: auto\n")); err != nil {
		t.Errorf("none and auto: %v", err)
	}
}

// The packages' /etc/gpupin/agent.yaml (deploy/systemd/agent.yaml) is a
// valid config as installed (all comments: no wants), and so are its
// commented examples once uncommented.
func TestPackagedAgentYAML(t *testing.T) {
	data, err := os.ReadFile("../deploy/systemd/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	uncommented := regexp.MustCompile(`(?m)^#(wants:|overrides:|  )`).ReplaceAll(data, []byte("$1"))
	for _, tc := range []struct {
		name      string
		data      []byte
		wants     int
		overrides int
	}{
		{"as installed", data, 0, 0},
		{"examples uncommented", uncommented, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := agent.ParseConfig(tc.data)
			if err != nil {
				t.Fatalf("%v\n%s", err, tc.data)
			}
			if len(cfg.Wants) != tc.wants || len(cfg.Overrides) != tc.overrides {
				t.Fatalf("%d wants and %d overrides, want %d and %d:\n%s", len(cfg.Wants), len(cfg.Overrides), tc.wants, tc.overrides, tc.data)
			}
		})
	}
}
