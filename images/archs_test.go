package images

import (
	"testing"

	"github.com/gpupin/gpupin/node"
)

func TestParseArchs(t *testing.T) {
	tests := []struct {
		in      string
		want    string // Archs.String(), "" for an error
		wantErr bool
	}{
		{in: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX", want: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"},
		{in: "7.5 8.0 9.0a 12.0+PTX", want: "7.5,8.0,9.0a,12.0+PTX"}, // TORCH_CUDA_ARCH_LIST
		{in: "8.0;8.6", want: "8.0,8.6"},
		{in: " 9.0 ,, 10.0f ", want: "9.0,10.0"},
		{in: "9.0a+PTX", want: "9.0a+PTX"},
		{in: "", wantErr: true},
		{in: " , ", wantErr: true},
		{in: "sm_90", wantErr: true},
		{in: "9", wantErr: true},
		{in: "9.0+ptx", wantErr: true},
		{in: "9.10", wantErr: true},
		{in: "+9.0", wantErr: true},
		{in: "0.5", wantErr: true},
		{in: "Hopper", wantErr: true},
	}
	for _, tc := range tests {
		got, err := ParseArchs(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParseArchs(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("ParseArchs(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestArchsCovers(t *testing.T) {
	tests := []struct {
		archs string
		cc    string
		want  bool
	}{
		{"9.0", "9.0", true},
		{"8.0", "8.6", true},  // SASS runs on later minors of its major
		{"8.6", "8.0", false}, // but not on earlier ones
		{"8.0", "9.0", false}, // nor across majors
		{"7.5,8.0,9.0", "7.0", false},
		{"7.0,7.5", "7.0", true},
		{"8.0+PTX", "9.0", true}, // PTX JITs upward
		{"12.0+PTX", "10.0", false},
		{"7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX", "12.1", true},
		{"7.0,7.5,8.0,8.6,8.9,9.0", "12.0", false},
		{"9.0a", "9.0", true},
		{"9.0a", "9.1", false},      // arch-specific SASS: that capability only
		{"9.0a+PTX", "10.0", false}, // and its PTX does not carry forward
		{"9.0a+PTX", "9.0", true},
		{"10.0f", "10.3", true},
	}
	for _, tc := range tests {
		as, err := ParseArchs(tc.archs)
		if err != nil {
			t.Fatalf("ParseArchs(%q): %v", tc.archs, err)
		}
		cc, err := node.ParseCC(tc.cc)
		if err != nil {
			t.Fatalf("ParseCC(%q): %v", tc.cc, err)
		}
		if got := as.Covers(cc); got != tc.want {
			t.Errorf("%s covers %s = %v, want %v", tc.archs, tc.cc, got, tc.want)
		}
	}
}
