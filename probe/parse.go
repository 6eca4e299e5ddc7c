package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// MaxLineBytes caps the verdict line: a probe that prints more is broken,
// and an unbounded line would let an image make gpupin decode megabytes of JSON.
const MaxLineBytes = 64 << 10

// TailBytes caps the output tail carried in a Failure.
const TailBytes = 2 << 10

// Failure is a failed probe: why, the tail of its output, and the verdict when
// the probe printed a well-formed one (ok:false, or ok:true contradicted by its exit code).
type Failure struct {
	Reason  string
	Tail    string
	Verdict *Verdict
}

func (f *Failure) Error() string {
	if f.Tail == "" {
		return "probe failed: " + f.Reason + " (no output)"
	}
	return "probe failed: " + f.Reason + "\n--- probe output (tail) ---\n" + f.Tail
}

// NewFailure builds a Failure with the tail of output, for callers that see a
// failure Parse cannot (a timeout, a container that did not start).
func NewFailure(reason string, output []byte) *Failure {
	return &Failure{Reason: reason, Tail: Tail(output)}
}

// Tail returns the last TailBytes of output, cut at a UTF-8 boundary, with
// control characters other than newline and tab escaped so that the text is
// safe to print on a terminal or in a log.
func Tail(output []byte) string {
	out := bytes.TrimRight(output, " \t\r\n")
	cut := false
	if len(out) > TailBytes {
		out = out[len(out)-TailBytes:]
		cut = true
		// Skip continuation bytes so the tail starts on a rune.
		for i := 0; i < utf8.UTFMax && len(out) > 0 && !utf8.RuneStart(out[0]); i++ {
			out = out[1:]
		}
	}
	var b strings.Builder
	if cut {
		b.WriteString("…")
	}
	for len(out) > 0 {
		r, size := utf8.DecodeRune(out)
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, out[0])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.Write(out[:size])
		}
		out = out[size:]
	}
	return b.String()
}

// Parse reads a probe's verdict from its combined output and exit code. It
// returns the verdict and nil only when the probe passed: exactly one verdict
// line, well-formed, ok:true with at least one device, every device ok, and
// exit code 0. Any other outcome is a *Failure (with the verdict, when the
// line itself was well-formed).
func Parse(output []byte, exitCode int) (*Verdict, error) {
	fail := func(format string, a ...any) (*Verdict, error) {
		return nil, NewFailure(fmt.Sprintf(format, a...), output)
	}

	var line []byte
	count := 0
	for rest := output; len(rest) > 0; {
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		l = bytes.TrimSuffix(l, []byte("\r"))
		if !isVerdictLine(l) {
			continue
		}
		count++
		if count == 1 {
			line = l
		}
	}
	switch {
	case count == 0:
		return fail("no %q line in the output (exit code %d)", strings.TrimSpace(LinePrefix), exitCode)
	case count > 1:
		return fail("%d %q lines in the output; a probe prints exactly one", count, strings.TrimSpace(LinePrefix))
	case len(line) > MaxLineBytes:
		return fail("verdict line too long (%d bytes, limit %d)", len(line), MaxLineBytes)
	}

	v, err := decodeVerdict(bytes.TrimPrefix(line, []byte(strings.TrimSpace(LinePrefix))))
	if err != nil {
		return fail("garbled verdict line: %v", err)
	}
	// Only gpupin decides that a verdict is simulated.
	v.Simulated = false

	failV := func(format string, a ...any) (*Verdict, error) {
		f := NewFailure(fmt.Sprintf(format, a...), output)
		f.Verdict = v
		return v, f
	}
	if !v.OK {
		detail := v.Detail
		if detail == "" {
			detail = "(no detail)"
		}
		for _, d := range v.Devices {
			if d.OK != nil && !*d.OK && d.Detail != "" {
				detail += fmt.Sprintf("; GPU %d: %s", d.Index, d.Detail)
			}
		}
		return failV("probe reported failure (exit code %d): %s", exitCode, detail)
	}
	if exitCode != 0 {
		return failV("verdict says ok but the probe exited with code %d", exitCode)
	}
	if len(v.Devices) == 0 {
		return failV("verdict says ok but lists no devices")
	}
	for _, d := range v.Devices {
		if d.OK != nil && !*d.OK {
			return failV("verdict says ok but GPU %d failed: %s", d.Index, d.Detail)
		}
	}
	return v, nil
}

// isVerdictLine reports whether l claims to be a verdict: the prefix, or the
// bare word alone (a truncated line, which must count as garbled, not absent).
func isVerdictLine(l []byte) bool {
	return bytes.HasPrefix(l, []byte(LinePrefix)) ||
		string(bytes.TrimRight(l, " \t")) == strings.TrimSpace(LinePrefix)
}

func decodeVerdict(js []byte) (*Verdict, error) {
	js = bytes.TrimSpace(js)
	if len(js) == 0 {
		return nil, errors.New("no JSON after the prefix")
	}
	// Presence is checked on the raw object because a missing "ok" would
	// otherwise decode as false, and a missing "devices" as none.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	for _, k := range []string{"ok", "devices"} {
		r, found := raw[k]
		if !found {
			return nil, fmt.Errorf("missing field %q", k)
		}
		if k == "ok" && string(bytes.TrimSpace(r)) == "null" {
			return nil, errors.New(`field "ok" is null`)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	// Unknown fields are schema errors; "runtime" is a map, so it stays free-form.
	dec.DisallowUnknownFields()
	var v Verdict
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	return &v, nil
}
