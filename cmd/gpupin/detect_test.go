package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestDetectSimulated(t *testing.T) {
	w := &choiceWorld{dir: t.TempDir()}
	mixed := w.nodeFile(t, "mixed", `{"driver":"580.82.07","cuda":"13.0","gpus":[
		{"index":0,"uuid":"GPU-a","name":"NVIDIA A100-SXM4-80GB","brand":"tesla","cc":"8.0","memory_mib":81920,"mig":"enabled"},
		{"index":1,"uuid":"GPU-h","name":"NVIDIA H100 80GB HBM3","cc":"9.0"}]}`)
	nodrv := w.nodeFile(t, "nodrv", factsNoDriver)
	tests := []struct {
		name string
		args []string
		code int
		out  []string
	}{
		{"human", []string{"detect", "--node", mixed}, exitOK, []string{
			"SIMULATED", "driver:      580.82.07", "cuda:        13.0", "platform:    ", "fingerprint: sha256-", "gpus:        2",
			"GPU 0  NVIDIA A100-SXM4-80GB", "uuid:   GPU-a", "brand:  tesla", "cc:     8.0", "memory: 81920 MiB", "mig:    enabled",
			"GPU 1  NVIDIA H100 80GB HBM3", "brand:  unknown", "memory: unknown", "mig:    not reported"}},
		{"global --node", []string{"--node", mixed, "detect"}, exitOK, []string{"SIMULATED", "GPU 1  NVIDIA H100"}},
		{"unsupported", []string{"detect", "--node", nodrv}, exitNoResult, []string{"SIMULATED", "unsupported: no NVIDIA driver (NVML init: ERROR_LIBRARY_NOT_FOUND (12))"}},
		{"unsupported JSON", []string{"detect", "--json", "--node", nodrv}, exitNoResult, []string{`"simulated": true`, `"unsupported": "no NVIDIA driver`}},
		{"an argument", []string{"detect", "extra"}, exitUsage, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, msg, code := choiceRun(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (%s):\n%s", code, tc.code, msg, out)
			}
			for _, s := range tc.out {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
		})
	}
}

// detect --json prints what --node reads back: the round trip keeps every fact.
func TestDetectJSONRoundTripSimulated(t *testing.T) {
	w := &choiceWorld{dir: t.TempDir()}
	out, msg, code := choiceRun(t, "detect", "--node", w.nodeFile(t, "h", factsH100on580), "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, msg)
	}
	var f map[string]any
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if f["simulated"] != true || f["driver"] != "580.82.07" || f["cuda"] != "13.0" || f["platform"] != "linux/amd64" {
		t.Errorf("facts = %v", f)
	}
	g := f["gpus"].([]any)[0].(map[string]any)
	if g["uuid"] != "GPU-1" || g["cc"] != "9.0" || g["memory_mib"] != float64(81559) || g["brand"] != "nvidia" {
		t.Errorf("gpu = %v", g)
	}
	again, msg, code := choiceRun(t, "detect", "--json", "--node", w.nodeFile(t, "again", out))
	if code != exitOK || again != out {
		t.Errorf("re-reading detect --json gave exit %d (%s):\n%s\nwant:\n%s", code, msg, again, out)
	}
}

// Without --node, detect reads NVML: on this machine (no driver) that is
// exit 3 with the reason; on a GPU machine, exit 0 with real facts.
func TestDetectRealNode(t *testing.T) {
	out, msg, code := choiceRun(t, "detect")
	if strings.Contains(out, "SIMULATED") {
		t.Errorf("facts from NVML say SIMULATED:\n%s", out)
	}
	switch code {
	case exitNoResult:
		if !strings.Contains(out, "unsupported: ") {
			t.Errorf("exit 3 without the reason:\n%s", out)
		}
	case exitOK:
		if !strings.Contains(out, "driver:") || !strings.Contains(out, "GPU 0") {
			t.Errorf("exit 0 without facts:\n%s", out)
		}
	default:
		t.Errorf("exit %d (%s):\n%s", code, msg, out)
	}
}
