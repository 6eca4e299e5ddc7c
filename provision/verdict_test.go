package provision

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/probe"
)

// The label's format is compactVerdict's; ReadPinVerdict reads what it
// writes, bounded checks included, and says when the label was cut.
func TestReadPinVerdict(t *testing.T) {
	many := make([]string, 12)
	for i := range many {
		many[i] = fmt.Sprintf("check %d", i)
	}
	long := strings.Repeat("x", 200)
	for _, tc := range []struct {
		name   string
		label  string
		want   PinVerdict
		errIs  error
		errMsg string
	}{
		{name: "hardware", label: compactVerdict(&probe.Verdict{OK: true, Devices: []probe.Device{{Index: 0, CC: "9.0", TFLOPS: 612.5}}}),
			want: PinVerdict{OK: true, Devices: []PinDevice{{0, "9.0", 612.5}}}},
		{name: "simulated", label: compactVerdict(&probe.Verdict{OK: true, Simulated: true, Devices: []probe.Device{{Index: 0, CC: "9.0"}},
			SimulatedChecks: []string{"bf16 matmul", long}}),
			want: PinVerdict{OK: true, Simulated: true, Devices: []PinDevice{{0, "9.0", 0}}, SimulatedChecks: []string{"bf16 matmul", long[:117] + "..."}}},
		{name: "many checks", label: compactVerdict(&probe.Verdict{OK: true, Simulated: true, SimulatedChecks: many}),
			want: PinVerdict{OK: true, Simulated: true, SimulatedChecks: append(append([]string{}, many[:8]...), "… and 4 more")}},
		{name: "made before verdicts were kept", label: ""},
		{name: "cut at the label limit", label: `{"ok":true,"devices":[],"simulated":true,"simulated_checks":["a","b` + "...",
			errIs: ErrVerdictTruncated, errMsg: "the verdict label was cut at containerd's label limit (70 bytes kept): which checks were simulated is lost"},
		{name: "not JSON", label: "{nope", errMsg: "verdict label: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadPinVerdict(tc.label)
			if tc.errMsg != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.errMsg) || (tc.errIs != nil && !errors.Is(err, tc.errIs)) {
					t.Fatalf("ReadPinVerdict(%q) = %+v, %v; want error %q", tc.label, got, err, tc.errMsg)
				}
				return
			}
			if err != nil || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Fatalf("ReadPinVerdict(%q) = %+v, %v\nwant %+v", tc.label, got, err, tc.want)
			}
		})
	}
}
