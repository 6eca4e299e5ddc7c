package main

import "testing"

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"1073741824", 1 << 30, true},
		{"512m", 512 << 20, true},
		{"512MiB", 512 << 20, true},
		{"512MB", 512 << 20, true},
		{"64GiB", 64 << 30, true},
		{"16g", 16 << 30, true},
		{"1.5g", 3 << 29, true},
		{"4k", 4096, true},
		{"2T", 2 << 40, true},
		{"100b", 100, true},
		{" 8 GiB ", 8 << 30, true},
		{"", 0, false},
		{"g", 0, false},
		{"-1g", 0, false},
		{"1e9", 0, false},
		{"1ib", 0, false},
		{"12p", 0, false},
		{"lots", 0, false},
		{"99999999999t", 0, false},
	} {
		got, err := parseBytes(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// formatBytes gives a flag its default from the library's constant: what
// it writes, parseBytes must read back to the same number.
func TestFormatBytesReadsBack(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{16 << 30, "16g"},
		{3 << 29, "1536m"},
		{4096, "4k"},
		{2 << 40, "2t"},
		{100, "100"},
		{0, "0"},
		{1<<20 + 1, "1048577"},
	} {
		got := formatBytes(tc.in)
		if got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
		if back, err := parseBytes(got); err != nil || back != tc.in {
			t.Errorf("parseBytes(formatBytes(%d) = %q) = %d, %v", tc.in, got, back, err)
		}
	}
}
