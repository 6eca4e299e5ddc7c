package agent_test

import (
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
