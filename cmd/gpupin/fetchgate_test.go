package main

import "testing"

// TestFreshPullsServed: the versions containerd reports, as Debian's
// package and a release built from source write them.
func TestFreshPullsServed(t *testing.T) {
	for _, c := range []struct {
		version string
		want    bool
	}{
		{"1.6.20~ds1", false},
		{"v1.7.35", false},
		{"2.4.2+unknown", true},
		{"v2.1.9", true},
		{"", true}, // unreadable: the gate's default
	} {
		if got := freshPullsServed(c.version); got != c.want {
			t.Errorf("freshPullsServed(%q) = %v, want %v", c.version, got, c.want)
		}
	}
}
