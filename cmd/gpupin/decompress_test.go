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
