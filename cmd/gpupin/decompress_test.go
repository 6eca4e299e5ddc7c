package main

import (
	"strings"
	"testing"

	"github.com/gpupin/gpupin/containerd"
)

// gpupin detect says what decompresses gzip layers, and what to install
// when the fast ones are missing.
func TestDecompressNote(t *testing.T) {
	for _, c := range []struct {
		gzip, want string
	}{
		{"/usr/bin/igzip", "gzip layers: igzip (/usr/bin/igzip)"},
		{"/usr/bin/unpigz", "apt-get install isal"},
		{"", "apt-get install isal pigz"},
	} {
		if got := decompressNote(containerd.Decompressors{Gzip: c.gzip}); !strings.Contains(got, c.want) {
			t.Errorf("gzip %q: %q, want it to say %q", c.gzip, got, c.want)
		}
	}
}

// The CLI reads containerd's switches for the gzip commands (bench/real.go
// sets them on the CLI) and hands them to the library as an option.
func TestDecompressOptionsFromTheEnvironment(t *testing.T) {
	for _, c := range []struct {
		igzip, pigz string
		want        containerd.DecompressOptions
	}{
		{"", "", containerd.DecompressOptions{}},
		{"1", "", containerd.DecompressOptions{NoIgzip: true}},
		{"1", "1", containerd.DecompressOptions{NoIgzip: true, NoPigz: true}},
		{"false", "true", containerd.DecompressOptions{NoPigz: true}},
		{"yes", "", containerd.DecompressOptions{}}, // as containerd: strconv.ParseBool
	} {
		t.Setenv(containerd.EnvDisableIgzip, c.igzip)
		t.Setenv(containerd.EnvDisablePigz, c.pigz)
		if got := decompressOptions(); got != c.want {
			t.Errorf("%s=%q %s=%q: %+v, want %+v", containerd.EnvDisableIgzip, c.igzip, containerd.EnvDisablePigz, c.pigz, got, c.want)
		}
	}
}
