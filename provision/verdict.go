package provision

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// PinVerdict is a pin's verdict as its io.gpupin.verdict label keeps it
// (compactVerdict writes it): whether the probe passed, each device's
// compute capability and speed, and on a simulated node the checks that
// were simulated.
type PinVerdict struct {
	OK              bool        `json:"ok"`
	Devices         []PinDevice `json:"devices"`
	Simulated       bool        `json:"simulated,omitempty"`
	SimulatedChecks []string    `json:"simulated_checks,omitempty"`
}

// PinDevice is one device of a PinVerdict.
type PinDevice struct {
	Index  int     `json:"i"`
	CC     string  `json:"cc"`
	TFLOPS float64 `json:"tflops"`
}

// ErrVerdictTruncated: the verdict label was cut at containerd's label
// limit (the pin store marks the cut with "..."), so what it said, the
// simulated checks among it, cannot be read.
var ErrVerdictTruncated = errors.New("the verdict label was cut at containerd's label limit")

// ReadPinVerdict reads a pin's verdict label. An empty label (a pin made
// before verdicts were kept) is a zero verdict; a cut one is
// ErrVerdictTruncated, never a verdict without simulated checks.
func ReadPinVerdict(label string) (PinVerdict, error) {
	var v PinVerdict
	if strings.TrimSpace(label) == "" {
		return v, nil
	}
	if err := json.Unmarshal([]byte(label), &v); err != nil {
		if strings.HasSuffix(label, "...") {
			return PinVerdict{}, fmt.Errorf("%w (%d bytes kept): which checks were simulated is lost", ErrVerdictTruncated, len(label))
		}
		return PinVerdict{}, fmt.Errorf("verdict label: %w", err)
	}
	return v, nil
}
