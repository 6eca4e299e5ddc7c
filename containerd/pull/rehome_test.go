package pull

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

// snapshotDir lays out what the overlayfs snapshotter makes for an active
// snapshot: ID/fs and ID/work under root.
func snapshotDir(t *testing.T, root, id string) string {
	t.Helper()
	for _, d := range []string{"fs", "work"} {
		if err := os.MkdirAll(filepath.Join(root, id, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(root, id, "fs")
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A layer extracted without its parent is moved, inode for inode, into
// the snapshot prepared on its parent, whose root keeps the owner the
// snapshotter gave it; the extraction snapshot is left empty, as its
// removal expects. A target that is not an empty upper directory is
// refused, and nothing moves.
func TestMoveUpper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the moved root is given the new one's owner")
	}
	cases := []struct {
		name    string
		setup   func(t *testing.T, dst string) // on the target before the move
		wantErr bool
	}{
		{name: "empty target", setup: func(t *testing.T, dst string) {
			if err := os.Chown(dst, 1000, 1001); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "target not empty", wantErr: true, setup: func(t *testing.T, dst string) {
			if err := os.WriteFile(filepath.Join(dst, "x"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			lower := snapshotDir(t, root, "1")
			src := snapshotDir(t, root, "2")
			dst := snapshotDir(t, root, "3")
			if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(filepath.Join(src, "a", "b", "f"), filepath.Join(src, "a", "h")); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mknod(filepath.Join(src, "a", "gone"), syscall.S_IFCHR, 0); err != nil {
				t.Fatal(err) // an overlay whiteout, as the extraction makes it
			}
			fileIno := ino(t, filepath.Join(src, "a", "b", "f"))
			tc.setup(t, dst)
			from := []mount.Mount{{Type: "bind", Source: src, Options: []string{"rbind", "rw"}}}
			to := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{
				"index=off", "workdir=" + filepath.Join(root, "3", "work"), "upperdir=" + dst, "lowerdir=" + lower}}}

			err := moveUpper(from, to)
			if tc.wantErr {
				if err == nil {
					t.Fatal("moved onto a target that was not empty")
				}
				if got := ino(t, filepath.Join(src, "a", "b", "f")); got != fileIno {
					t.Errorf("the layer's file changed where it was: inode %d, was %d", got, fileIno)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := ino(t, filepath.Join(dst, "a", "b", "f")); got != fileIno {
				t.Errorf("moved file has inode %d, want %d (moved, not copied)", got, fileIno)
			}
			if ino(t, filepath.Join(dst, "a", "h")) != fileIno {
				t.Error("the hardlink no longer shares its file's inode")
			}
			fi, err := os.Lstat(filepath.Join(dst, "a", "gone"))
			if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
				t.Errorf("whiteout device: %v, %v", fi, err)
			}
			fi, err = os.Lstat(dst)
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1001 || fi.Mode().Perm() != 0o755 {
				t.Errorf("moved root is %d:%d %v, want the snapshotter's 1000:1001 0755", st.Uid, st.Gid, fi.Mode().Perm())
			}
			if !emptyDir(src) {
				t.Error("the extraction snapshot's directory is not there, empty, after the move")
			}
		})
	}
}
