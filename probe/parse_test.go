package probe

import (
	"errors"
	"strings"
	"testing"
)

const goodLine = `GPUPIN-PROBE {"ok":true,"devices":[{"index":0,"uuid":"GPU-1","name":"NVIDIA H200","cc":"9.0","tflops":612.5,"max_abs_err":0.25}],"runtime":{"torch":"2.8.0","cuda":"12.9","nested":{"x":[1,2]}}}`

func TestParse(t *testing.T) {
	long := LinePrefix + `{"ok":true,"devices":[],"detail":"` + strings.Repeat("x", MaxLineBytes) + `"}`
	tests := []struct {
		name    string
		out     string
		exit    int
		wantErr string // substring of the error; "" means success
		wantV   bool   // a verdict comes back with the error
	}{
		{name: "good", out: "loading...\n" + goodLine + "\n"},
		{name: "good CRLF and trailing noise", out: "a\r\n" + goodLine + "\r\nbye\n"},
		{name: "good without newline", out: goodLine},
		{name: "empty output", out: "", exit: 0, wantErr: "no \"GPUPIN-PROBE\" line"},
		{name: "no line, exit 1", out: "Traceback...\nRuntimeError: boom\n", exit: 1, wantErr: "exit code 1"},
		{name: "prefix not at line start", out: "x " + goodLine + "\n", wantErr: "no \"GPUPIN-PROBE\" line"},
		{name: "bare prefix", out: "GPUPIN-PROBE\n", wantErr: "garbled verdict line"},
		{name: "garbled", out: `GPUPIN-PROBE {"ok":tru` + "\n", wantErr: "garbled verdict line"},
		{name: "not an object", out: "GPUPIN-PROBE [1,2]\n", wantErr: "garbled verdict line"},
		{name: "trailing data", out: `GPUPIN-PROBE {"ok":true,"devices":[]} {}` + "\n", wantErr: "garbled verdict line"},
		{name: "two lines", out: goodLine + "\n" + goodLine + "\n", wantErr: "2 \"GPUPIN-PROBE\" lines"},
		{name: "oversized", out: long + "\n", wantErr: "verdict line too long"},
		{name: "missing ok", out: `GPUPIN-PROBE {"devices":[{"index":0}]}`, wantErr: `missing field "ok"`},
		{name: "null ok", out: `GPUPIN-PROBE {"ok":null,"devices":[{"index":0}]}`, wantErr: `"ok" is null`},
		{name: "missing devices", out: `GPUPIN-PROBE {"ok":true}`, wantErr: `missing field "devices"`},
		{name: "unknown field", out: `GPUPIN-PROBE {"ok":true,"devices":[],"extra":1}`, wantErr: `unknown field "extra"`},
		{name: "wrong type", out: `GPUPIN-PROBE {"ok":"yes","devices":[]}`, wantErr: "garbled verdict line"},
		{name: "ok with exit 1", out: goodLine, exit: 1, wantErr: "exited with code 1", wantV: true},
		{name: "ok with no devices", out: `GPUPIN-PROBE {"ok":true,"devices":[]}`, wantErr: "lists no devices", wantV: true},
		{name: "ok with a failed device", out: `GPUPIN-PROBE {"ok":true,"devices":[{"index":3,"ok":false,"detail":"mismatch"}]}`, wantErr: "GPU 3 failed: mismatch", wantV: true},
		{name: "reported failure", out: `GPUPIN-PROBE {"ok":false,"devices":[],"detail":"CUDA driver version is insufficient"}`, exit: 1, wantErr: "CUDA driver version is insufficient", wantV: true},
		{name: "reported failure exit 0", out: `GPUPIN-PROBE {"ok":false,"devices":null}`, wantErr: "(no detail)", wantV: true},
		{name: "reported device failure", out: `GPUPIN-PROBE {"ok":false,"devices":[{"index":1,"ok":false,"detail":"arch sm_120 missing"}],"detail":"1 of 1 GPUs failed"}`, exit: 1, wantErr: "GPU 1: arch sm_120 missing", wantV: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Parse([]byte(tt.out), tt.exit)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if !v.OK || len(v.Devices) != 1 || v.Devices[0].CC != "9.0" || v.Runtime["torch"] != "2.8.0" {
					t.Fatalf("verdict = %+v", v)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse succeeded, want error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %q, want it to contain %q", err, tt.wantErr)
			}
			var f *Failure
			if !errors.As(err, &f) {
				t.Fatalf("error %T is not a *Failure", err)
			}
			if (v != nil) != tt.wantV || (f.Verdict != nil) != tt.wantV {
				t.Fatalf("verdict returned = %v, in failure = %v, want %v", v != nil, f.Verdict != nil, tt.wantV)
			}
			if tt.out != "" && f.Tail == "" {
				t.Fatalf("failure has no tail")
			}
		})
	}
}

func TestParseIgnoresProbeSimulatedFlag(t *testing.T) {
	v, err := Parse([]byte(`GPUPIN-PROBE {"ok":true,"devices":[{"index":0}],"simulated":true}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.Simulated {
		t.Fatal("Simulated was taken from the probe's own line")
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"plain", "hello\nworld\n\n", "hello\nworld"},
		{"escapes", "a\x1b[31mred\x00\rb\tc", `a\x1b[31mred\x00\x0db` + "\tc"},
		{"invalid utf8", "ok\xff\xfe", `ok\xff\xfe`},
		{"C1 control", "x\u0085y", `x\x85y`},
		{"keeps unicode", "héllo ✓", "héllo ✓"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Tail([]byte(tt.in)); got != tt.want {
				t.Fatalf("Tail(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}

	// A long output keeps only its end, starting on a rune boundary.
	long := strings.Repeat("é", TailBytes) + "END"
	got := Tail([]byte(long))
	if !strings.HasPrefix(got, "…é") || !strings.HasSuffix(got, "END") || len(got) > TailBytes+len("…") {
		t.Fatalf("Tail of long output: len %d, prefix %q, suffix %q", len(got), got[:8], got[len(got)-3:])
	}
}

func TestFailureError(t *testing.T) {
	err := error(NewFailure("no line", []byte("boom\x07\n")))
	want := "probe failed: no line\n--- probe output (tail) ---\nboom\\x07"
	if err.Error() != want {
		t.Fatalf("Error() = %q, want %q", err.Error(), want)
	}
	if got := NewFailure("timed out", nil).Error(); got != "probe failed: timed out (no output)" {
		t.Fatalf("Error() = %q", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		goodLine,
		"GPUPIN-PROBE {}",
		`GPUPIN-PROBE {"ok":false,"devices":[{"index":0,"ok":false}]}`,
		"GPUPIN-PROBE \n" + goodLine,
		"noise\r\nGPUPIN-PROBE {\"ok\":true,\"devices\":null}\x00",
		"\xff\xfeGPUPIN-PROBE",
	} {
		f.Add([]byte(s), 0)
		f.Add([]byte(s), 1)
	}
	f.Fuzz(func(t *testing.T, out []byte, exit int) {
		v, err := Parse(out, exit)
		if err == nil {
			if v == nil || !v.OK || exit != 0 || len(v.Devices) == 0 || v.Simulated {
				t.Fatalf("accepted a verdict that must fail: %+v exit %d", v, exit)
			}
			return
		}
		var fl *Failure
		if !errors.As(err, &fl) {
			t.Fatalf("error %T is not a *Failure", err)
		}
		if len(fl.Tail) > TailBytes*4+8 {
			t.Fatalf("tail too long: %d", len(fl.Tail))
		}
		_ = err.Error()
	})
}
