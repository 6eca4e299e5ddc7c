package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Facts is what `gpupin detect --json` prints and `--node FILE` reads.
type Facts struct {
	Driver   string `json:"driver,omitempty"`
	CUDA     string `json:"cuda,omitempty"`
	Platform string `json:"platform"`
	GPUs     []GPU  `json:"gpus"`
	// Simulated is true when the facts were read from a file, not from NVML:
	// every result made from them must say so.
	Simulated bool `json:"simulated,omitempty"`
	// Unsupported is set when the node cannot run GPU engines at all
	// (no driver, no NVML); it says why.
	Unsupported string `json:"unsupported,omitempty"`
}

// GPU is one device as NVML reports it.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Name      string `json:"name"`
	Brand     string `json:"brand,omitempty"`
	CC        string `json:"cc"`
	MemoryMiB uint64 `json:"memory_mib,omitempty"`
	MIG       string `json:"mig,omitempty"`
}

// Supported reports whether the node has a driver and at least one GPU.
func (f *Facts) Supported() bool { return f.Unsupported == "" }

// CUDAVersion parses the CUDA version the driver supports.
func (f *Facts) CUDAVersion() (Version, error) { return ParseVersion(f.CUDA) }

// DriverVersion parses the driver version (e.g. 580.82.07).
func (f *Facts) DriverVersion() (Version, error) { return ParseVersion(f.Driver) }

// Fingerprint identifies the driver and the set of GPUs. A pin made under one
// fingerprint is re-proved under another: a driver upgrade or a GPU swap can
// break an image that ran before.
func (f *Facts) Fingerprint() string {
	parts := make([]string, 0, len(f.GPUs))
	for _, g := range f.GPUs {
		parts = append(parts, g.UUID+"/"+g.CC)
	}
	// Index order can change across reboots; the set of GPUs is what matters.
	sort.Strings(parts)
	sum := sha256.Sum256([]byte("driver=" + f.Driver + ";cuda=" + f.CUDA + ";gpus=" + strings.Join(parts, ",")))
	return "sha256-" + hex.EncodeToString(sum[:])[:16]
}

// Validate checks facts read from a file.
func (f *Facts) Validate() error {
	if f.Unsupported != "" {
		return nil
	}
	if _, err := ParseVersion(f.Driver); err != nil {
		return fmt.Errorf("node facts: driver: %w", err)
	}
	if _, err := ParseVersion(f.CUDA); err != nil {
		return fmt.Errorf("node facts: cuda: %w", err)
	}
	if len(f.GPUs) == 0 {
		return fmt.Errorf("node facts: no GPUs listed; a node without GPUs is {\"unsupported\": \"reason\"}")
	}
	for i, g := range f.GPUs {
		if _, err := ParseCC(g.CC); err != nil {
			return fmt.Errorf("node facts: gpus[%d] (%s): %w", i, g.Name, err)
		}
	}
	if _, _, err := splitPlatform(f.Platform); err != nil {
		return fmt.Errorf("node facts: %w", err)
	}
	return nil
}

// LoadFile reads simulated facts. They are marked simulated whatever the file says.
func LoadFile(path string) (*Facts, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read node facts: %w", err)
	}
	var f Facts
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse node facts %s: %w", path, err)
	}
	if f.Platform == "" {
		f.Platform = HostPlatform()
	}
	if f.GPUs == nil {
		// Printed as [] rather than null, as NVML's reader does.
		f.GPUs = []GPU{}
	}
	f.Simulated = true
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// HostPlatform is this machine's os/arch, the default platform of a node.
func HostPlatform() string { return runtime.GOOS + "/" + runtime.GOARCH }

func splitPlatform(p string) (string, string, error) {
	os, arch, ok := strings.Cut(p, "/")
	if !ok || os == "" || arch == "" {
		return "", "", fmt.Errorf("platform %q: want os/arch, e.g. linux/amd64", p)
	}
	return os, arch, nil
}

// Version is a dotted numeric version: 13.0, 580.82.07.
type Version []int

// ParseVersion parses a dotted numeric version of 1 to 4 parts.
func ParseVersion(s string) (Version, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty version")
	}
	fields := strings.Split(s, ".")
	if len(fields) > 4 {
		return nil, fmt.Errorf("version %q: too many parts", s)
	}
	v := make(Version, len(fields))
	for i, p := range fields {
		// Digits only: Atoi alone would take "+5" and "-0".
		if !allDigits(p) || len(p) > 9 {
			return nil, fmt.Errorf("version %q: %q is not a number", s, p)
		}
		v[i], _ = strconv.Atoi(p)
	}
	return v, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// Compare returns -1, 0 or 1; missing parts count as 0.
func (v Version) Compare(o Version) int {
	for i := 0; i < len(v) || i < len(o); i++ {
		a, b := 0, 0
		if i < len(v) {
			a = v[i]
		}
		if i < len(o) {
			b = o[i]
		}
		if a != b {
			if a < b {
				return -1
			}
			return 1
		}
	}
	return 0
}

func (v Version) String() string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ".")
}

// CC is a compute capability, major.minor.
type CC struct{ Major, Minor int }

// ParseCC parses "9.0", "12.0", "8.6".
func ParseCC(s string) (CC, error) {
	maj, min, ok := strings.Cut(strings.TrimSpace(s), ".")
	if !ok {
		return CC{}, fmt.Errorf("compute capability %q: want major.minor, e.g. 9.0", s)
	}
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !allDigits(maj) || !allDigits(min) || len(maj) > 2 || len(min) > 1 ||
		err1 != nil || err2 != nil || a < 1 || b < 0 {
		return CC{}, fmt.Errorf("compute capability %q: want major.minor, e.g. 9.0", s)
	}
	return CC{a, b}, nil
}

func (c CC) String() string { return fmt.Sprintf("%d.%d", c.Major, c.Minor) }

// Less orders capabilities.
func (c CC) Less(o CC) bool {
	return c.Major < o.Major || (c.Major == o.Major && c.Minor < o.Minor)
}

// CUDAFromDriverAPI turns nvmlSystemGetCudaDriverVersion_v2's integer into
// "major.minor": 12090 → 12.9.
func CUDAFromDriverAPI(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}
