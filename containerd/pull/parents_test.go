package pull

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// The fixup never leaves the layer: an implicit directory whose path now
// runs through a symbolic link (to the host's directory here) is left
// alone, whatever the filter recorded. No tar entry reaches this (the
// filter forgets a replaced directory); it is the fixup's own guard.
func TestParentFixupFollowsNoSymlink(t *testing.T) {
	host := t.TempDir()
	if err := os.Mkdir(filepath.Join(host, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	if err := os.MkdirAll(filepath.Join(parent, "e", "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(parent, "e", "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	layer := t.TempDir()
	if err := os.Symlink(host, filepath.Join(layer, "e")); err != nil {
		t.Fatal(err)
	}
	d := newImplicitDirs(layer)
	d.dirs["e"] = &implicitDir{}
	d.dirs["e/tmp"] = &implicitDir{}
	before, err := os.Lstat(filepath.Join(host, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.copyParentAttrs([]string{parent}); err != nil {
		t.Fatal(err)
	}
	after, err := os.Lstat(filepath.Join(host, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	b, a := before.Sys().(*syscall.Stat_t), after.Sys().(*syscall.Stat_t)
	if after.Mode() != before.Mode() || a.Uid != b.Uid || a.Gid != b.Gid {
		t.Errorf("the host's directory changed through the layer's link: %v %d:%d, was %v %d:%d", after.Mode(), a.Uid, a.Gid, before.Mode(), b.Uid, b.Gid)
	}
}

func TestRealDir(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"a/b", "target"} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("target", filepath.Join(root, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rel  string
		want bool
	}{
		{"a", true},
		{"a/b", true},
		{"l", false},
		{"l/x", false},
		{"f", false},
		{"missing", false},
		{"a/missing", false},
	} {
		if got := realDir(root, tc.rel); got != tc.want {
			t.Errorf("realDir(%q) = %v, want %v", tc.rel, got, tc.want)
		}
	}
}
