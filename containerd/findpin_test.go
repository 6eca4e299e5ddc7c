package containerd_test

import (
	"errors"
	"testing"

	"github.com/gpupin/gpupin/containerd"
)

// FindPin is the lookup `gpupin run` uses: a tampered record is refused by
// key, reference and source alike, and never passed over for another
// record.
func TestFindPin(t *testing.T) {
	good := containerd.Pin{Key: "demo:1.0", Ref: "reg/demo@sha256:aa", Digest: "sha256:aa", Source: "reg/demo:1.0"}
	bad := containerd.Pin{Key: "demo:1.0", Ref: "reg/demo@sha256:bb", Digest: "sha256:cc", Source: "reg/demo:1.0", Tampered: true}
	lone := containerd.Pin{Key: "solo:2", Ref: "reg/solo@sha256:dd", Digest: "sha256:ee", Source: "reg/solo:2", Tampered: true}
	other := containerd.Pin{Key: "other:1", Ref: "reg/other@sha256:ff", Digest: "sha256:ff", Source: "reg/other:1"}
	pins := []containerd.Pin{good, bad, lone, other}
	for _, tc := range []struct {
		name    string
		target  string
		want    string // the pin's Ref
		wantErr error
	}{
		{"key with a pin beside a tampered record", "demo:1.0", good.Ref, nil},
		{"the tampered record by reference", bad.Ref, "", containerd.ErrTampered},
		{"the good record by reference", good.Ref, good.Ref, nil},
		{"key held only by a tampered record", "solo:2", "", containerd.ErrTampered},
		{"reference of a lone tampered record", lone.Ref, "", containerd.ErrTampered},
		{"source of a lone tampered record", lone.Source, "", containerd.ErrTampered},
		{"source", other.Source, other.Ref, nil},
		{"unknown", "nope:1", "", containerd.ErrNoPin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerd.FindPin(pins, tc.target)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != nil {
					t.Fatalf("FindPin(%s) = %+v, %v; want %v", tc.target, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got == nil || got.Ref != tc.want || got.Tampered {
				t.Fatalf("FindPin(%s) = %+v, %v; want %s", tc.target, got, err, tc.want)
			}
		})
	}
}
