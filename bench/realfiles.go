package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The image of real files: what dominates a real engine image's pull is
// decompression and the creation of many small files, which layers of
// random bytes (stored by gzip, one file each) never show. Its layers are
// trees that every machine of this project has (the Go toolchain, shared
// libraries, Python's standard library), tarred once into the cache with
// fixed headers and gzipped at level 6, as image builders do; later runs
// reuse the cached blobs, so every run measures the same bytes.
type realLayer struct {
	Name string // what it holds
	Dir  string // the tree, as it goes into the layer (relative to /)
}

// realLayers is the recipe; realVersion names it in the cache, so a change
// of the recipe builds new blobs instead of reusing stale ones.
var realLayers = []realLayer{
	{"shared libraries", "usr/lib/x86_64-linux-gnu"},
	{"Go toolchain", "usr/local/go"},
	{"Python standard library", "usr/lib/python3.11"},
}

const realVersion = "real-v2"

// realMeta is one cached layer of the real-files image.
type realMeta struct {
	layerMeta
	Name     string `json:"name"`
	Files    int    `json:"files"`
	Unpacked int64  `json:"unpacked"` // tar bytes
}

// cachedRealLayers returns the real-files layers, building them into the
// cache's blob directory the first time.
func cachedRealLayers(cache string) ([]realMeta, error) {
	metaPath := filepath.Join(cache, realVersion+".json")
	var metas []realMeta
	if data, err := os.ReadFile(metaPath); err == nil && json.Unmarshal(data, &metas) == nil && len(metas) == len(realLayers) {
		ok := true
		for _, m := range metas {
			if st, err := os.Stat(m.path(cache)); err != nil || st.Size() != m.Size {
				ok = false
			}
		}
		if ok {
			return metas, nil
		}
	}
	metas = nil
	for _, l := range realLayers {
		if _, err := os.Stat("/" + l.Dir); err != nil {
			return nil, fmt.Errorf("real-files image: %s (%s): %w", l.Name, "/"+l.Dir, err)
		}
		logf("building the real-files layer %q from /%s into %s (once; kept for later runs)", l.Name, l.Dir, cache)
		t0 := time.Now()
		m, err := genRealLayer(cache, l)
		if err != nil {
			return nil, fmt.Errorf("real-files layer %s: %w", l.Name, err)
		}
		logf("  %d files, %d MiB tar, %d MiB gzip, in %s", m.Files, m.Unpacked>>20, m.Size>>20, time.Since(t0).Round(time.Second))
		metas = append(metas, m)
	}
	data, _ := json.MarshalIndent(metas, "", "  ")
	if err := os.WriteFile(metaPath, data, 0o644); err != nil {
		return nil, err
	}
	return metas, nil
}

func realToLayers(cache string, metas []realMeta) []v1.Layer {
	out := make([]v1.Layer, len(metas))
	for i, m := range metas {
		out[i] = fileLayer{m: m.layerMeta, cache: cache}
	}
	return out
}

// genRealLayer tars dir (sorted, owned by 0:0, epoch timestamps, modes
// kept, hard links as links) and gzips it with pigz -6 when it is
// installed (the same bytes format as gzip -6, in a third of the time),
// else with Go's gzip at the default level.
func genRealLayer(cache string, l realLayer) (realMeta, error) {
	tmp, err := os.CreateTemp(filepath.Join(cache, "blobs"), "gen-*")
	if err != nil {
		return realMeta{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	dz := sha256.New()
	cnt := &countWriter{}
	out := io.MultiWriter(tmp, dz, cnt)

	var zw io.WriteCloser
	var wait func() error
	if pigz, err := exec.LookPath("pigz"); err == nil {
		cmd := exec.Command(pigz, "-6", "-n", "-c")
		cmd.Stdout = out
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return realMeta{}, err
		}
		if err := cmd.Start(); err != nil {
			return realMeta{}, err
		}
		zw, wait = stdin, cmd.Wait
	} else {
		gz, _ := gzip.NewWriterLevel(out, gzip.DefaultCompression)
		zw, wait = gz, func() error { return nil }
	}
	du := sha256.New()
	tcnt := &countWriter{}
	files, err := writeTree(io.MultiWriter(zw, du, tcnt), "/", l.Dir)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if werr := wait(); err == nil {
		err = werr
	}
	if err != nil {
		return realMeta{}, err
	}
	if err := tmp.Close(); err != nil {
		return realMeta{}, err
	}
	m := realMeta{layerMeta: layerMeta{Digest: "sha256:" + hexOf(dz), DiffID: "sha256:" + hexOf(du), Size: cnt.n},
		Name: l.Name, Files: files, Unpacked: tcnt.n}
	if err := os.MkdirAll(filepath.Dir(m.path(cache)), 0o755); err != nil {
		return realMeta{}, err
	}
	return m, os.Rename(tmp.Name(), m.path(cache))
}

// writeTree writes root/dir and its parents as a tar stream.
func writeTree(w io.Writer, root, dir string) (int, error) {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	parts := strings.Split(dir, "/")
	for i := 1; i < len(parts); i++ {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts[:i], "/") + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return 0, err
		}
	}
	var paths []string
	err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return 0, err
	}
	sort.Strings(paths)
	files := 0
	links := map[[2]uint64]string{} // (dev, inode) → the first name, for hard links
	for _, p := range paths {
		st, err := os.Lstat(p)
		if err != nil {
			return 0, err
		}
		rel, _ := filepath.Rel(root, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(st.Mode().Perm()), ModTime: epoch, Format: tar.FormatPAX}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && st.Mode().IsRegular() && sys.Nlink > 1 {
			// As tar stores them: the second name is a link to the first.
			key := [2]uint64{uint64(sys.Dev), sys.Ino}
			if first, ok := links[key]; ok {
				h.Typeflag, h.Linkname = tar.TypeLink, first
				if err := tw.WriteHeader(h); err != nil {
					return 0, err
				}
				files++
				continue
			}
			links[key] = h.Name
		}
		switch m := st.Mode(); {
		case m.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case m&fs.ModeSymlink != 0:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = os.Readlink(p); err != nil {
				return 0, err
			}
		case m.IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		default:
			continue // sockets, devices: not image content
		}
		if err := tw.WriteHeader(h); err != nil {
			return 0, err
		}
		files++
		if h.Typeflag != tar.TypeReg {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return 0, err
		}
		n, err := io.Copy(tw, f)
		f.Close()
		if err != nil {
			return 0, err
		}
		if n != h.Size {
			return 0, errors.New(p + " changed while being read")
		}
	}
	return files, tw.Close()
}
