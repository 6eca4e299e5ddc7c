package probe

import "strings"

// EngineFamily maps an engine name to the family the probes know: the
// upstream repository vllm/vllm-openai is engine "vllm-openai" by its name,
// and it is vLLM that the torch probe must import.
func EngineFamily(engine string) string {
	e := strings.ToLower(strings.TrimSpace(engine))
	for _, f := range []string{"vllm", "sglang"} {
		if e == f || strings.HasPrefix(e, f+"-") || strings.HasPrefix(e, f+"_") {
			return f
		}
	}
	return e
}
