package images

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/node"
)

func TestParseRequireVar(t *testing.T) {
	tests := []struct {
		in      string
		want    string // alternatives as "a,b|c", "" for none
		wantErr string
	}{
		{in: "cuda>=12.9", want: "cuda>=12.9"},
		{in: "cuda>=12.9 brand=tesla,driver>=535,driver<536", want: "cuda>=12.9|brand=tesla,driver>=535,driver<536"},
		{in: "  cuda>=13.0   arch>=7.5 ", want: "cuda>=13.0|arch>=7.5"},
		{in: "CUDA>=12.0,Brand=Tesla", want: "cuda>=12.0,brand=tesla"},
		{in: "cuda>=12.9,,driver>=535,", want: "cuda>=12.9,driver>=535"}, // empty terms skipped, as libnvidia-container does
		{in: "cuda>=12.9 ,", want: "cuda>=12.9|"},
		{in: "driver!=535.54.03 driver==550", want: "driver!=535.54.03|driver==550"},
		{in: "", want: ""},
		{in: "cuda", wantErr: "want key, operator and value"},
		{in: ">=12.9", wantErr: "want key, operator and value"},
		{in: "cuda>=", wantErr: "bad value"},
		{in: "cuda>=>=12", wantErr: "bad value"},
		{in: "cuda>=twelve", wantErr: "not a number"},
		{in: "arch>=7", wantErr: "compute capability"},
		{in: "brand>=tesla", wantErr: "brand takes = or !="},
		{in: "gpu=h100", wantErr: "unknown key"},
		{in: "cuda=>12", wantErr: "bad value"},
		{in: strings.Repeat("cuda>=12.9 ", 1000), wantErr: "more than"},
	}
	for _, tc := range tests {
		v, err := ParseRequireVar("NVIDIA_REQUIRE_CUDA", tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRequireVar(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseRequireVar(%q): %v", tc.in, err)
			continue
		}
		var alts []string
		for _, a := range v.Alternatives {
			var s []string
			for _, c := range a {
				s = append(s, c.String())
			}
			alts = append(alts, strings.Join(s, ","))
		}
		if got := strings.Join(alts, "|"); got != tc.want {
			t.Errorf("ParseRequireVar(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRequirementsCheck(t *testing.T) {
	tesla := func(driver, cuda, cc string) *node.Facts {
		return &node.Facts{Driver: driver, CUDA: cuda, GPUs: []node.GPU{{Index: 0, Name: "H100", Brand: "tesla", CC: cc}}}
	}
	withBrand := func(f *node.Facts, brand string) *node.Facts { f.GPUs[0].Brand = brand; return f }
	twoGPUs := &node.Facts{Driver: "580.82.07", CUDA: "13.0", GPUs: []node.GPU{
		{Index: 0, Name: "A100", Brand: "nvidia", CC: "8.0"}, {Index: 1, Name: "V100", Brand: "tesla", CC: "7.0"}}}
	const fwd = "cuda>=12.9 brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536"
	tests := []struct {
		name   string
		env    []string
		node   *node.Facts
		want   bool
		reason string // substring of the reason when not met
	}{
		{"main branch holds", []string{"NVIDIA_REQUIRE_CUDA=" + fwd}, tesla("575.57.08", "12.9", "9.0"), true, ""},
		{"tesla 535 forward compatibility", []string{"NVIDIA_REQUIRE_CUDA=" + fwd}, tesla("535.104.05", "12.2", "9.0"), true, ""},
		{"tesla 536 is outside the branch", []string{"NVIDIA_REQUIRE_CUDA=" + fwd}, tesla("536.25", "12.2", "9.0"), false, "none of its 2 brand/driver branches matches GPU 0 (brand tesla, driver 536.25)"},
		{"geforce 535 has no branch", []string{"NVIDIA_REQUIRE_CUDA=" + fwd}, withBrand(tesla("535.104.05", "12.2", "8.9"), "geforce"), false, "driver 535.104.05 supports CUDA 12.2; NVIDIA_REQUIRE_CUDA needs cuda>=12.9"},
		{"brand compared case-insensitively", []string{"NVIDIA_REQUIRE_CUDA=" + fwd}, withBrand(tesla("535.104.05", "12.2", "9.0"), "Tesla"), true, ""},
		{"unknown brand takes no branch", []string{"NVIDIA_REQUIRE_CUDA=" + fwd}, withBrand(tesla("535.104.05", "12.2", "9.0"), ""), false, "brand unknown"},
		{"legacy CUDA_VERSION means cuda>=major.minor", []string{"CUDA_VERSION=12.8.1"}, tesla("570.86.15", "12.8", "9.0"), true, ""},
		{"legacy CUDA_VERSION not met", []string{"CUDA_VERSION=12.8.1"}, tesla("550.54.15", "12.4", "9.0"), false, "needs cuda>=12.8"},
		{"empty NVIDIA_REQUIRE_CUDA counts as absent", []string{"CUDA_VERSION=12.8.1", "NVIDIA_REQUIRE_CUDA="}, tesla("550.54.15", "12.4", "9.0"), false, "needs cuda>=12.8"},
		{"every variable must hold", []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_ARCH=arch>=8.0"}, twoGPUs, false, "GPU 1 (V100) has compute capability 7.0; NVIDIA_REQUIRE_ARCH needs arch>=8.0"},
		{"arch per GPU holds on all", []string{"NVIDIA_REQUIRE_ARCH=arch>=7.0"}, twoGPUs, true, ""},
		{"JETPACK is ignored, as the toolkit does", []string{"NVIDIA_REQUIRE_JETPACK=cuda>=99.0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"}, twoGPUs, true, ""},
		{"driver terms", []string{"NVIDIA_REQUIRE_DRIVER=driver>=590"}, twoGPUs, false, "the driver is 580.82.07; NVIDIA_REQUIRE_DRIVER needs driver>=590"},
		{"DISABLE_REQUIRE=1 turns it off", []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=1"}, twoGPUs, true, ""},
		{"DISABLE_REQUIRE=true turns it off", []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=true"}, twoGPUs, true, ""},
		{"DISABLE_REQUIRE=false keeps it", []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=false"}, twoGPUs, false, "needs cuda>=99.0"},
		{"DISABLE_REQUIRE=yes is not a bool to the toolkit", []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=yes"}, twoGPUs, false, "needs cuda>=99.0"},
		{"empty alternative first: holds (libnvidia-container's loop)", []string{"NVIDIA_REQUIRE_CUDA=, cuda>=99.0"}, twoGPUs, true, ""},
		{"empty alternative after a failed one ends the evaluation", []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0 , cuda>=12.0"}, twoGPUs, false, "needs cuda>=99.0"},
		{"no requirements", []string{"PATH=/bin"}, twoGPUs, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := RequirementsFromEnv(tc.env)
			if err != nil {
				t.Fatalf("RequirementsFromEnv: %v", err)
			}
			ok, why := r.Check(tc.node)
			if ok != tc.want {
				t.Fatalf("Check = %v (%s), want %v", ok, why, tc.want)
			}
			if !ok && !strings.Contains(why, tc.reason) {
				t.Errorf("reason %q, want it to contain %q", why, tc.reason)
			}
			if ok && why != "" {
				t.Errorf("met, yet reason %q", why)
			}
		})
	}
}

func TestRequirementsFromEnvErrors(t *testing.T) {
	for _, env := range [][]string{
		{"NVIDIA_REQUIRE_CUDA=cuda>=x"},
		{"NVIDIA_REQUIRE_FOO=color=red"},
		{"CUDA_VERSION=twelve"},
	} {
		if r, err := RequirementsFromEnv(env); err == nil {
			t.Errorf("RequirementsFromEnv(%q) = %+v, want an error", env, r)
		}
	}
}

func TestDeriveMetadata(t *testing.T) {
	tests := []struct {
		name     string
		env      []string
		labels   map[string]string
		want     Metadata
		disabled bool
		wantErr  string
	}{
		{name: "nvidia/cuda 12.9 base", env: []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=" + "cuda>=12.9 brand=tesla,driver>=535,driver<536"},
			want: Metadata{Variant: "cu129", CUDA: "12.9"}},
		{name: "13.0 with torch arch list", env: []string{"CUDA_VERSION=13.0.0", "TORCH_CUDA_ARCH_LIST=7.5 8.0 8.9 9.0 10.0 12.0+PTX"},
			want: Metadata{Variant: "cu13", CUDA: "13.0", Archs: "7.5 8.0 8.9 9.0 10.0 12.0+PTX"}},
		{name: "labels name engine, probe and archs", env: []string{"CUDA_VERSION=12.8.0"},
			labels: map[string]string{AnnotationEngine: "vllm", AnnotationProbe: "torch", AnnotationArchs: "9.0"},
			want:   Metadata{Variant: "cu128", CUDA: "12.8", Engine: "vllm", Probe: "torch", Archs: "9.0"}},
		{name: "CUDA from NVIDIA_REQUIRE_CUDA without CUDA_VERSION", env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=470,driver<471"},
			want: Metadata{Variant: "cu126", CUDA: "12.6"}},
		{name: "disabled requirements", env: []string{"CUDA_VERSION=12.4.1", "NVIDIA_DISABLE_REQUIRE=1"},
			want: Metadata{Variant: "cu124", CUDA: "12.4"}, disabled: true},
		{name: "no CUDA at all", env: []string{"PATH=/bin"}, wantErr: "cannot tell which CUDA"},
		{name: "bad arch list", env: []string{"CUDA_VERSION=12.8.0", "TORCH_CUDA_ARCH_LIST=Hopper"}, wantErr: "arch list"},
		{name: "bad probe label", env: []string{"CUDA_VERSION=12.8.0"}, labels: map[string]string{AnnotationProbe: "magic"}, wantErr: "want torch, cuda or exec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			md, req, err := DeriveMetadata(tc.env, tc.labels)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if md != tc.want {
				t.Errorf("metadata = %+v, want %+v", md, tc.want)
			}
			if (req == nil) != tc.disabled {
				t.Errorf("requirements = %+v, disabled want %v", req, tc.disabled)
			}
		})
	}
}

func TestVariantNameForCUDA(t *testing.T) {
	for in, want := range map[string]string{"13.0": "cu13", "12.9": "cu129", "12.10": "cu1210", "13": "cu13"} {
		if got := VariantNameForCUDA(in); got != want {
			t.Errorf("VariantNameForCUDA(%q) = %q, want %q", in, got, want)
		}
	}
}
