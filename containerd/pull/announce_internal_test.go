package pull

import "testing"

// TestDaemonAnnounces: the versions containerd reports, as Debian's
// package and releases built from source write them. ContentCreate came in
// 2.1.0 (containerd PR 11006).
func TestDaemonAnnounces(t *testing.T) {
	for _, c := range []struct {
		version string
		want    bool
	}{
		{"1.6.20~ds1", false},
		{"v1.7.35", false},
		{"v2.0.7", false},
		{"v2.1.0", true},
		{"v2.1.9", true},
		{"2.4.2+unknown", true},
		{"v3.0.0", true},
		{"", false}, // unreadable: announce, a duplicate costs nothing
		{"main", false},
	} {
		if got := DaemonAnnounces(c.version); got != c.want {
			t.Errorf("DaemonAnnounces(%q) = %v, want %v", c.version, got, c.want)
		}
	}
}
