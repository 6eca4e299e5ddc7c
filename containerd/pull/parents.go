package pull

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/continuity/fs"
	"github.com/containerd/continuity/sysx"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

// Parent directories a layer does not name.
//
// A layer may write a/b/file without a header for a/b: crane append, many
// daemonless builders and hand-made tars do. containerd's extraction
// (archive.Apply's mkparent) then makes a/b and copies its owner, mode,
// times and extended attributes from the first parent layer that has it
// (WithParents), so /tmp keeps 1777 and a user's home its owner. A layer
// extracted in parallel has no parent underneath yet: archive.Apply makes
// such a directory 0755 root-owned, and in the merged view it would hide
// the real one. implicitDirs notes, header by header, which directories
// archive.Apply is about to make so, and copyParentAttrs gives them, once
// the parent is committed, what mkparent would have given them.

// implicitDirs records the directories an extraction into root makes for
// entries whose parent directory the layer does not name.
type implicitDirs struct {
	root string
	dirs map[string]*implicitDir // by path relative to root
}

type implicitDir struct {
	// header: the layer names the directory after all (later in the tar):
	// its owner, mode and times are the header's; only the parent's
	// extended attributes that the header did not set are added.
	header bool
	// touched: something was created in it after it was made, which set
	// its modification time, as it does under containerd.
	touched bool
	// inUnnamed: it was made inside an implicit directory the layer had
	// not named yet, which under containerd was then as mkparent copied
	// it: a new directory takes that one's group if it was setgid.
	inUnnamed bool
}

// rel is path relative to root ("" for root itself).
func rel(root, path string) string {
	if len(path) <= len(root) {
		return ""
	}
	return path[len(root)+1:]
}

func newImplicitDirs(root string) *implicitDirs {
	return &implicitDirs{root: filepath.Clean(root), dirs: map[string]*implicitDir{}}
}

// filter is an archive.Filter that sees each header just before
// archive.Apply extracts it, and resolves its path as archive.Apply does.
// It accepts every header.
func (d *implicitDirs) filter(hdr *tar.Header) (bool, error) {
	ppath, base := filepath.Split(hdr.Name)
	ppath, err := fs.RootPath(d.root, ppath)
	if err != nil {
		return true, nil // archive.Apply fails on it with its own error
	}
	path := filepath.Join(ppath, filepath.Join("/", base))
	if path == d.root {
		return true, nil
	}
	if ppath != d.root {
		parent := ppath
		if base == "" {
			parent = filepath.Dir(path)
		}
		// mkparent makes every missing directory down to parent, from
		// the top; each one made is an entry in the directory above it.
		var made []string
		for p := parent; len(p) > len(d.root); p = filepath.Dir(p) {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				break
			}
			made = append(made, p)
		}
		for i := len(made) - 1; i >= 0; i-- {
			above := d.dirs[rel(d.root, filepath.Dir(made[i]))]
			if above != nil {
				above.touched = true
			}
			d.dirs[rel(d.root, made[i])] = &implicitDir{inUnnamed: above != nil && !above.header}
		}
	}
	// (A whiteout removes nothing here: overlay's conversion makes a
	// device beside what it names, and fails on a path the layer made
	// itself, which leaves the layer to the daemon.)
	st, statErr := os.Lstat(path)
	switch {
	case strings.HasPrefix(base, whiteoutPrefix):
	case hdr.Typeflag != tar.TypeDir:
		// archive.Apply removes what is at the path first, for any entry
		// but a directory (a PAX global header too, which it then skips).
		if statErr == nil && st.IsDir() {
			d.forget(rel(d.root, path))
		}
	default:
		if dir := d.dirs[rel(d.root, path)]; dir != nil {
			dir.header = true
		}
	}
	// An entry changes its directory's modification time unless it is an
	// opaque marker (an attribute on overlayfs), a directory there already
	// (merged), or a global header with nothing to remove.
	if dir := d.dirs[rel(d.root, filepath.Dir(path))]; dir != nil && base != whiteoutOpaque {
		switch {
		case hdr.Typeflag == tar.TypeXGlobalHeader && statErr != nil:
		case statErr != nil || !st.IsDir() || hdr.Typeflag != tar.TypeDir:
			dir.touched = true
		}
	}
	return true, nil
}

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// forget drops the directory rel and everything under it: replaced in the
// layer, none of it is a directory mkparent made.
func (d *implicitDirs) forget(rel string) {
	for r := range d.dirs {
		if r == rel || strings.HasPrefix(r, rel+"/") {
			delete(d.dirs, r)
		}
	}
}

// copyParentAttrs gives each implicit directory what containerd's
// mkparent gives it from parents (the parent chain's layer directories,
// top first): owner, mode, times and extended attributes of the first
// layer that has the path, unless that layer has something else there.
// A directory no parent has, made by mkparent inside one it has just
// copied, takes the group of that one if it was setgid, as the kernel
// gives it (the setgid bit passes too, and mkparent's chmod to 0755 takes
// it away). A default ACL copied there would pass to what is made inside
// as well, directories and files: that is not reproduced.
func (d *implicitDirs) copyParentAttrs(parents []string) error {
	rels := make([]string, 0, len(d.dirs))
	for rel := range d.dirs {
		rels = append(rels, rel)
	}
	sort.Strings(rels) // a parent before what is under it
	// The group of each implicit directory whose copy made it setgid:
	// what containerd's mkdir in it gave a new directory, before any
	// header of the layer named it.
	setgid := map[string]uint32{}
	for _, rel := range rels {
		path := filepath.Join(d.root, rel)
		if !realDir(d.root, rel) {
			// Removed, replaced, or under a symbolic link the layer put
			// in its way: never followed out of the layer.
			continue
		}
		src, err := parentDir(parents, rel)
		if err != nil {
			return err
		}
		dir := d.dirs[rel]
		switch {
		case src != "":
			fi, err := os.Lstat(src)
			if err != nil {
				return fmt.Errorf("parent directory %s: %w", rel, err)
			}
			if fi.Mode()&os.ModeSetgid != 0 {
				setgid[rel] = fi.Sys().(*syscall.Stat_t).Gid
			}
			if err := d.copyFrom(src, path, dir); err != nil {
				return fmt.Errorf("parent directory %s: %w", rel, err)
			}
		case !dir.header && dir.inUnnamed:
			// New here: containerd's default, 0755 root, in the group of
			// a setgid directory it was made in. (Made in a directory the
			// layer had named, it was given that one's group here too.)
			if gid, ok := setgid[filepath.Dir(rel)]; ok {
				if err := lchown(path, -1, int(gid)); err != nil {
					return fmt.Errorf("parent directory %s: %w", rel, err)
				}
			}
		}
	}
	return nil
}

// realDir says whether every component of rel under root is a directory,
// none a symbolic link: a later entry of the layer may have put one where
// a directory was made.
func realDir(root, rel string) bool {
	p := root
	for c := range strings.SplitSeq(rel, "/") {
		p = filepath.Join(p, c)
		st, err := os.Lstat(p)
		if err != nil || !st.IsDir() {
			return false
		}
	}
	return true
}

// lchown is os.Lchown that, as containerd's copyDirInfo, lets a
// filesystem refuse a change that changes nothing.
func lchown(path string, uid, gid int) error {
	err := os.Lchown(path, uid, gid)
	if err == nil || !os.IsPermission(err) {
		return err
	}
	fi, serr := os.Lstat(path)
	if serr != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if (uid == -1 || int(st.Uid) == uid) && (gid == -1 || int(st.Gid) == gid) {
		return nil
	}
	return err
}

// parentDir finds rel as mkparent looks for it: in each layer in turn,
// symbolic links resolved inside that layer; "" when none has it, or the
// first that has it holds something other than a directory.
func parentDir(parents []string, rel string) (string, error) {
	for _, p := range parents {
		pp, err := fs.RootPath(p, "/"+rel)
		if err != nil {
			return "", err
		}
		st, err := os.Lstat(pp)
		switch {
		case err == nil && st.IsDir():
			return pp, nil
		case err == nil:
			return "", nil // replaced: containerd copies nothing
		case !errors.Is(err, os.ErrNotExist):
			return "", err
		}
	}
	return "", nil
}

func (d *implicitDirs) copyFrom(src, path string, dir *implicitDir) (retErr error) {
	if dir.header {
		// The header's mode came last under containerd; a POSIX ACL
		// copied now rewrites the group bits, so the mode goes back after.
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		defer func() {
			if err := os.Chmod(path, fi.Mode()); err != nil && retErr == nil {
				retErr = err
			}
		}()
	} else {
		fi, err := os.Lstat(src)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if err := lchown(path, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := os.Chmod(path, fi.Mode()); err != nil {
			return err
		}
		cur, err := os.Lstat(path)
		if err != nil {
			return err
		}
		mtime := fs.StatMtime(st)
		if dir.touched {
			// Under containerd the entries made in it after the copy set
			// its modification time; here they came before the copy.
			mtime = fs.StatMtime(cur.Sys().(*syscall.Stat_t))
		}
		ts := []unix.Timespec{unix.NsecToTimespec(syscall.TimespecToNsec(fs.StatAtime(st))), unix.NsecToTimespec(syscall.TimespecToNsec(mtime))}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("set times: %w", err)
		}
	}
	keys, err := sysx.LListxattr(src)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENODATA) {
			return nil
		}
		return err
	}
	for _, k := range keys {
		if strings.HasPrefix(k, "trusted.") {
			continue // overlayfs's own, as containerd leaves them
		}
		v, err := sysx.LGetxattr(src, k)
		if err != nil {
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENODATA) {
				continue
			}
			return err
		}
		// Create only: an attribute the layer's header set stays.
		if err := unix.Lsetxattr(path, k, v, unix.XATTR_CREATE); err != nil &&
			!errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("set %s: %w", k, err)
		}
	}
	return nil
}

// parentLayers lists the layer directories of the committed chain parent,
// top first, as an overlay mount of a child names them (lowerdir): what
// containerd's extraction onto that parent looks into for missing parent
// directories.
func (u *unpacker) parentLayers(ctx context.Context, sn snapshots.Snapshotter, parent digest.Digest) ([]string, error) {
	key := fmt.Sprintf("gpupin-parents-%s-%s", rand.Text(), parent)
	mounts, err := sn.View(ctx, key, parent.String())
	if err != nil {
		return nil, fmt.Errorf("view the parent %s: %w", parent, err)
	}
	defer func() {
		if err := sn.Remove(context.WithoutCancel(ctx), key); err != nil {
			// A view holds no data; the collector takes it with the lease.
			slog.WarnContext(ctx, "remove the parent view", "key", key, "err", err)
		}
	}()
	dirs := lowerDirs(mounts)
	if len(dirs) == 0 {
		return nil, fmt.Errorf("the parent %s mounts as %v: no layer directories to read", parent, mounts)
	}
	return dirs, nil
}

// lowerDirs are the layer directories of a read-only view's mounts: a bind
// of a single layer, or an overlay's lowerdir.
func lowerDirs(mounts []mount.Mount) []string {
	if len(mounts) != 1 {
		return nil
	}
	m := mounts[0]
	switch m.Type {
	case "bind":
		return []string{m.Source}
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				return strings.Split(v, ":")
			}
		}
	}
	return nil
}
