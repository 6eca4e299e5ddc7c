package probe

import (
	"strings"
	"testing"
)

func TestSelect(t *testing.T) {
	tests := []struct {
		name                         string
		annotation, engine, fallback string
		want                         Kind
		wantErr                      string
	}{
		{name: "annotation wins over engine", annotation: "cuda", engine: "vllm", fallback: "torch", want: CUDA},
		{name: "annotation exec", annotation: "exec", engine: "sglang", want: Exec},
		{name: "annotation case and space", annotation: " Torch ", want: Torch},
		{name: "annotation unknown", annotation: "jax", engine: "vllm", wantErr: `io.gpupin.probe annotation: unknown probe "jax" (accepted: torch, cuda, exec)`},
		{name: "annotation cannot ask for sim", annotation: "sim", wantErr: `unknown probe "sim"`},
		{name: "vllm", engine: "vllm", fallback: "cuda", want: Torch},
		{name: "sglang", engine: "SGLang", want: Torch},
		// An engine gpupin has no default for takes the operator's --probe.
		{name: "other engine with --probe", engine: "myllm", fallback: "torch", want: Torch},
		{name: "other engine", engine: "llama.cpp", want: CUDA},
		{name: "engine family", engine: "vllm-openai", fallback: "cuda", want: Torch},
		{name: "fallback", fallback: "exec", want: Exec},
		{name: "fallback sim", fallback: "sim", want: Sim},
		{name: "fallback unknown", fallback: "gpu", wantErr: `default probe: unknown probe "gpu" (accepted: torch, cuda, exec, sim)`},
		{name: "nothing", want: CUDA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Select(tt.annotation, tt.engine, tt.fallback)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Select = %q, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Select = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
