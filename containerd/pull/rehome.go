package pull

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"golang.org/x/sys/unix"
)

// Parallel extraction without rebase.
//
// Below containerd 2.2 the overlayfs snapshotter cannot commit a snapshot
// onto a parent it was not prepared on. Layers are still extracted at once,
// each into a snapshot prepared without a parent, as on 2.2; at its turn a
// layer's directory is renamed over the empty one of a snapshot prepared
// on its committed parent, which is then committed as containerd commits
// it. Both directories are the snapshotter's, on one filesystem: the move
// is one rename, whatever the layer holds, and every file keeps its inode,
// so hardlinks, owners, modes, extended attributes, device nodes and the
// overlay whiteouts and opaque markers the extraction made stay as they
// were written.

// moves counts the layers moved onto their parents, for tests.
var moves atomic.Int64

// rehome moves l's files, extracted into its parentless snapshot, into a
// snapshot prepared on l.parent, and leaves l holding the new one. Where
// the move cannot be made the daemon applies the layer there instead.
func (u *unpacker) rehome(ctx context.Context, sn snapshots.Snapshotter, l *layer) error {
	staging, stagingKey := l.mounts, l.key
	l.key = ""
	defer func() {
		if stagingKey == "" {
			return
		}
		if err := sn.Remove(context.WithoutCancel(ctx), stagingKey); err != nil {
			// Empty now, or half of a failed pull: the pull's lease
			// holds it until the collector takes it.
			slog.WarnContext(ctx, "remove a layer's extraction snapshot", "key", stagingKey, "err", err)
		}
	}()
	if err := u.prepare(ctx, sn, l, l.parent); err != nil {
		return err
	}
	if l.exists {
		return nil // committed meanwhile by another pull
	}
	if l.onParent {
		if err := l.waitFetched(ctx); err != nil {
			return err
		}
		return u.daemonApply(ctx, l, l.mounts)
	}
	err := moveUpper(staging, l.mounts)
	if err == nil {
		moves.Add(1)
		return nil
	}
	// Nothing was moved: the layer's files stay where they were, and
	// the daemon applies it onto its parent, as containerd would.
	trace(ctx, l, "not moved onto its parent; the daemon applies it", "err", err)
	slog.WarnContext(ctx, "move an extracted layer onto its parent; the daemon applies it", "layer", l.desc.Digest, "err", err)
	fallbacks.Add(1)
	u.stored.Store(true) // the next moves would fail too: their blobs are stored
	return u.daemonApply(ctx, l, l.mounts)
}

// moveUpper renames the directory of from (a parentless snapshot's bind
// mount) over the upper directory of to (an overlay on its parent), which
// must be empty. The moved root takes the owner the snapshotter gave to's
// (its parent's): archive.Apply never changes a root, so under containerd
// the layer's root is the one the snapshotter made.
func moveUpper(from, to []mount.Mount) error {
	src, ok := bindSource(from)
	if !ok {
		return fmt.Errorf("the extraction snapshot mounts as %v, not as one directory", from)
	}
	dst, _, ok := localTarget(to, false)
	if !ok {
		return fmt.Errorf("the snapshot on the parent mounts as %v, not as an empty overlay upper directory this process can reach", to)
	}
	if src == dst {
		return errors.New("the extraction snapshot and the one on the parent are one directory")
	}
	fi, err := os.Lstat(dst)
	if err != nil {
		return fmt.Errorf("move onto the parent: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := lchown(src, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("move onto the parent: %w", err)
	}
	if err := unix.Chmod(src, st.Mode&0o7777); err != nil {
		return fmt.Errorf("move onto the parent: %w", err)
	}
	// rename(2) replaces an empty directory with a directory atomically
	// (os.Rename refuses any directory in the way).
	if err := unix.Rename(src, dst); err != nil {
		return fmt.Errorf("move onto the parent: rename %s %s: %w", src, dst, err)
	}
	// The old snapshot's directory, as its removal expects it.
	if err := os.Mkdir(src, 0o755); err != nil {
		slog.Warn("recreate a moved snapshot's directory", "dir", src, "err", err)
	}
	return nil
}

// bindSource is the directory a single bind mount mounts.
func bindSource(mounts []mount.Mount) (string, bool) {
	if len(mounts) != 1 || mounts[0].Type != "bind" {
		return "", false
	}
	return mounts[0].Source, true
}
