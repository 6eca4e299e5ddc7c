package pull

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// streamable says whether this process extracts a layer of media type mt
// itself: a tar, plain, gzip or zstd. Anything else (an encrypted layer, a
// foreign type) is the daemon's, which knows its stream processors.
func streamable(mt string) bool {
	switch mt {
	case ocispec.MediaTypeImageLayer, ocispec.MediaTypeImageLayerGzip, ocispec.MediaTypeImageLayerZstd,
		images.MediaTypeDockerSchema2Layer, images.MediaTypeDockerSchema2LayerGzip:
		return true
	}
	return false
}

// localTarget says where this process can write a snapshot's files: a
// single overlay mount's upperdir, or a bind mount's source, when the
// directories containerd named are here and freshly made (so this is the
// host's view of containerd's root, not a same-named path of a container).
func localTarget(mounts []mount.Mount, parallelChild bool) (string, []archive.ApplyOpt, bool) {
	if len(mounts) != 1 {
		return "", nil, false
	}
	m := mounts[0]
	switch m.Type {
	case "bind":
		if slices.Contains(m.Options, "ro") || !emptyDir(m.Source) || !isDir(dirOf(m.Source)+"/work") {
			return "", nil, false
		}
		var opts []archive.ApplyOpt
		if parallelChild {
			opts = append(opts, archive.WithConvertWhiteout(archive.OverlayConvertWhiteout))
		}
		return m.Source, opts, true
	case "overlay":
		var upper, work string
		var lower []string
		for _, o := range m.Options {
			switch {
			case strings.HasPrefix(o, "upperdir="):
				upper = strings.TrimPrefix(o, "upperdir=")
			case strings.HasPrefix(o, "workdir="):
				work = strings.TrimPrefix(o, "workdir=")
			case strings.HasPrefix(o, "lowerdir="):
				lower = strings.Split(strings.TrimPrefix(o, "lowerdir="), ":")
			}
		}
		if upper == "" || !emptyDir(upper) || !isDir(work) {
			return "", nil, false
		}
		for _, d := range lower {
			if !isDir(d) {
				return "", nil, false
			}
		}
		opts := []archive.ApplyOpt{archive.WithConvertWhiteout(archive.OverlayConvertWhiteout)}
		if len(lower) > 0 {
			opts = append(opts, archive.WithParents(lower))
		}
		return upper, opts, true
	}
	return "", nil, false
}

func dirOf(p string) string {
	if i := strings.LastIndex(p, "/"); i > 0 {
		return p[:i]
	}
	return p
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func emptyDir(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.IsDir() {
		return false
	}
	_, err = f.Readdirnames(1)
	return errors.Is(err, io.EOF)
}

// clearDir empties a snapshot directory that a dropped extraction wrote to.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(dir + "/" + e.Name()); err != nil {
			return err
		}
	}
	return nil
}

// applyStream decompresses r and extracts it into dir, returning the
// digest of the uncompressed stream (the diff ID). (Hashing on a goroutine
// of its own, beside the extraction, measured no faster: a pull keeps both
// cores busy.)
func applyStream(ctx context.Context, dir string, r io.Reader, slot *zstdSlot, gzipCmd string, opts []archive.ApplyOpt) (digest.Digest, error) {
	rc, err := decompress(ctx, r, slot, gzipCmd)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	dg := digest.Canonical.Digester()
	tr := io.TeeReader(rc, dg.Hash())
	if _, err := archive.Apply(ctx, dir, tr, opts...); err != nil {
		return "", err
	}
	// What follows the tar's end counts too, as containerd counts it.
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return "", err
	}
	if err := rc.Close(); err != nil {
		return "", err
	}
	return dg.Digest(), nil
}

// bindToOverlay turns the bind mount of a parentless snapshot into an
// overlay mount of its upper directory over parents (its chain's layer
// directories, top first), so that the diff service converts whiteouts
// and gives a directory the layer does not name its parent's attributes,
// as it does for a snapshot prepared on its parent. The daemon writes
// into the upper directory and mounts nothing. (containerd's own parallel
// unpack passes no lower directories, and so makes such directories
// 0755 root-owned.)
func bindToOverlay(mounts []mount.Mount, parents []string) []mount.Mount {
	if len(mounts) != 1 || mounts[0].Type != "bind" {
		return mounts
	}
	m := mount.Mount{Type: "overlay", Source: "overlay"}
	for _, o := range mounts[0].Options {
		if o != "rbind" {
			m.Options = append(m.Options, o)
		}
	}
	m.Options = append(m.Options, "upperdir="+mounts[0].Source)
	if len(parents) > 0 {
		m.Options = append(m.Options, "lowerdir="+strings.Join(parents, ":"))
	}
	return []mount.Mount{m}
}
