package probe

import "testing"

func TestEngineFamily(t *testing.T) {
	for in, want := range map[string]string{
		"vllm": "vllm", "vllm-openai": "vllm", "VLLM_cu129": "vllm", "sglang-srt": "sglang",
		"vllmx": "vllmx", "llama.cpp": "llama.cpp", "": "",
	} {
		if got := EngineFamily(in); got != want {
			t.Errorf("EngineFamily(%q) = %q, want %q", in, got, want)
		}
	}
}
