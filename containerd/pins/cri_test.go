package pins_test

import (
	"testing"

	"github.com/gpupin/gpupin/containerd"
)

func TestCRIPinningOf(t *testing.T) {
	for _, tc := range []struct {
		version string
		kept    bool
	}{
		{"1.6.20~ds1", false}, {"v1.6.38", false}, {"1.7.27", true}, {"2.4.2+unknown", true}, {"v2.0.0", true},
	} {
		if got := containerd.CRIPinningOf(tc.version); got.Kept != tc.kept || got.Note == "" {
			t.Errorf("CRIPinningOf(%q) = %+v, want kept=%v", tc.version, got, tc.kept)
		}
	}
}
