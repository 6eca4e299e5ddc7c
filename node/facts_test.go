package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" = error
	}{
		{"13.0", "13.0"}, {"580.82.07", "580.82.7"}, {" 12.9 ", "12.9"}, {"12", "12"}, {"1.2.3.4", "1.2.3.4"},
		{"", ""}, {"1.2.3.4.5", ""}, {"12.x", ""}, {"+12.9", ""}, {"-0.1", ""}, {"12..9", ""}, {"12.9.", ""},
		{"1234567890.0", ""}, {"١٢.٩", ""}, {"0x10", ""},
	}
	for _, tc := range tests {
		v, err := ParseVersion(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("ParseVersion(%q) = %v, want an error", tc.in, v)
			}
			continue
		}
		if err != nil || v.String() != tc.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %s", tc.in, v, err, tc.want)
		}
	}
}

func TestVersionCompare(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"13.0", "12.9", 1}, {"12.9", "13.0", -1}, {"13", "13.0", 0}, {"12.10", "12.9", 1},
		{"580.82.07", "580.65.06", 1}, {"535.104.05", "536", -1}, {"575.57.08", "575.57.08", 0},
	}
	for _, tc := range tests {
		a, _ := ParseVersion(tc.a)
		b, _ := ParseVersion(tc.b)
		if got := a.Compare(b); got != tc.want {
			t.Errorf("%s vs %s = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestParseCC(t *testing.T) {
	tests := []struct {
		in   string
		want CC
		ok   bool
	}{
		{"9.0", CC{9, 0}, true}, {"12.0", CC{12, 0}, true}, {"8.6", CC{8, 6}, true}, {" 7.5", CC{7, 5}, true},
		{"9", CC{}, false}, {"9.10", CC{}, false}, {"0.5", CC{}, false}, {"+9.0", CC{}, false}, {"9.-0", CC{}, false},
		{"100.0", CC{}, false}, {"9.0a", CC{}, false}, {"", CC{}, false},
	}
	for _, tc := range tests {
		got, err := ParseCC(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseCC(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if !(CC{8, 9}).Less(CC{9, 0}) || (CC{9, 0}).Less(CC{9, 0}) || (CC{12, 0}).String() != "12.0" {
		t.Error("CC ordering or rendering is wrong")
	}
}

func TestCUDAFromDriverAPI(t *testing.T) {
	for in, want := range map[int]string{12090: "12.9", 13000: "13.0", 12020: "12.2", 11080: "11.8", 13010: "13.1"} {
		if got := CUDAFromDriverAPI(in); got != want {
			t.Errorf("CUDAFromDriverAPI(%d) = %s, want %s", in, got, want)
		}
	}
}

func TestFingerprint(t *testing.T) {
	a := &Facts{Driver: "580.82.07", CUDA: "13.0", GPUs: []GPU{{Index: 0, UUID: "GPU-a", CC: "9.0"}, {Index: 1, UUID: "GPU-b", CC: "9.0"}}}
	swapped := &Facts{Driver: "580.82.07", CUDA: "13.0", GPUs: []GPU{{Index: 0, UUID: "GPU-b", CC: "9.0"}, {Index: 1, UUID: "GPU-a", CC: "9.0"}}}
	upgraded := &Facts{Driver: "580.95.05", CUDA: "13.0", GPUs: a.GPUs}
	replaced := &Facts{Driver: "580.82.07", CUDA: "13.0", GPUs: []GPU{{UUID: "GPU-a", CC: "9.0"}, {UUID: "GPU-c", CC: "9.0"}}}
	if a.Fingerprint() != swapped.Fingerprint() {
		t.Error("index order changed the fingerprint")
	}
	if a.Fingerprint() == upgraded.Fingerprint() || a.Fingerprint() == replaced.Fingerprint() {
		t.Error("a driver upgrade or a GPU swap kept the fingerprint")
	}
	if !strings.HasPrefix(a.Fingerprint(), "sha256-") || len(a.Fingerprint()) != len("sha256-")+16 {
		t.Errorf("fingerprint %q: want sha256- and 16 hex digits", a.Fingerprint())
	}
}

func TestLoadFileSimulated(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string
		check   func(t *testing.T, f *Facts)
	}{
		{name: "issue example", body: `{"driver":"580.82.07","cuda":"13.0","platform":"linux/amd64","gpus":[{"index":0,"uuid":"GPU-1","name":"NVIDIA H100 80GB HBM3","cc":"9.0","memory_mib":81559}]}`,
			check: func(t *testing.T, f *Facts) {
				if !f.Simulated || !f.Supported() || f.GPUs[0].MemoryMiB != 81559 || f.Platform != "linux/amd64" {
					t.Errorf("facts = %+v", f)
				}
			}},
		{name: "platform defaults to this machine's", body: `{"driver":"580.82.07","cuda":"13.0","gpus":[{"index":0,"uuid":"GPU-1","name":"x","cc":"9.0"}]}`,
			check: func(t *testing.T, f *Facts) {
				if f.Platform != HostPlatform() {
					t.Errorf("platform = %q, want %q", f.Platform, HostPlatform())
				}
			}},
		{name: "simulated whatever the file says", body: `{"driver":"580.82.07","cuda":"13.0","simulated":false,"gpus":[{"index":0,"uuid":"GPU-1","name":"x","cc":"9.0"}]}`,
			check: func(t *testing.T, f *Facts) {
				if !f.Simulated {
					t.Error("not marked simulated")
				}
			}},
		{name: "unsupported node", body: `{"unsupported":"no NVIDIA driver (test)"}`,
			check: func(t *testing.T, f *Facts) {
				if f.Supported() || f.GPUs == nil || !f.Simulated {
					t.Errorf("facts = %+v: want unsupported, GPUs [] not nil, simulated", f)
				}
			}},
		{name: "bad driver", body: `{"driver":"latest","cuda":"13.0","gpus":[{"cc":"9.0"}]}`, wantErr: "driver"},
		{name: "bad cuda", body: `{"driver":"580.82.07","cuda":"13","gpus":[{"cc":"9.x"}]}`, wantErr: "gpus[0]"},
		{name: "no gpus", body: `{"driver":"580.82.07","cuda":"13.0","gpus":[]}`, wantErr: "no GPUs listed"},
		{name: "bad platform", body: `{"driver":"580.82.07","cuda":"13.0","platform":"amd64","gpus":[{"cc":"9.0"}]}`, wantErr: "want os/arch"},
		{name: "not JSON", body: `driver: 580`, wantErr: "parse node facts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "node.json")
			if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := LoadFile(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, f)
			// Static hands out copies: a caller's edit does not change the next read.
			s := Static{Facts: f}
			a, _ := s.Read(context.Background())
			a.GPUs = append(a.GPUs, GPU{})
			b, _ := s.Read(context.Background())
			if len(b.GPUs) != len(f.GPUs) {
				t.Error("Static.Read shares its GPU slice")
			}
		})
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("missing file: no error")
	}
}

func TestBrandName(t *testing.T) {
	for in, want := range map[int]string{2: "tesla", 5: "geforce", 14: "nvidia", 13: "nvidiartx", 99: "unknown", -1: "unknown"} {
		if got := BrandName(in); got != want {
			t.Errorf("BrandName(%d) = %q, want %q", in, got, want)
		}
	}
}
