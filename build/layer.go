package build

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Reproducible tar: the same inputs give the same bytes, whoever builds them
// and whenever. Entries are sorted, owned by 0:0 with no names, stamped with
// the epoch, without atime/ctime, and modes normalised to 0755 (directories
// and executables) or 0644, so a checkout's umask does not leak in.

// dirLayer is a layer holding dir's tree under dest. The tar is produced on
// demand, each time the layer is read, instead of being held in memory.
func dirLayer(dir, dest string, epoch time.Time, mt types.MediaType) (v1.Layer, error) {
	if _, err := walkSorted(dir); err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeDirTar(pw, dir, dest, epoch)) }()
		return pr, nil
	}, layerOpts(mt)...)
}

// layerOpts encodes a layer as its media type says: zstd for
// OCILayerZStd (gpupin build --compression zstd), gzip otherwise.
func layerOpts(mt types.MediaType) []tarball.LayerOption {
	opts := []tarball.LayerOption{tarball.WithMediaType(mt)}
	if mt == types.OCILayerZStd {
		opts = append(opts, tarball.WithCompression(compression.ZStd))
	}
	return opts
}

type fileEntry struct {
	rel  string // slash-separated, relative to the root
	info fs.FileInfo
}

// walkSorted lists a tree in byte order of its paths.
func walkSorted(root string) ([]fileEntry, error) {
	var out []fileEntry
	err := filepath.Walk(root, func(p string, info fs.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		m := info.Mode()
		if !m.IsRegular() && !m.IsDir() && m&fs.ModeSymlink == 0 {
			return fmt.Errorf("%s: %s files cannot go in a layer", p, m.Type())
		}
		out = append(out, fileEntry{rel: filepath.ToSlash(rel), info: info})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("layer dir %s: %w", root, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out, nil
}

func normMode(m fs.FileMode) int64 {
	switch {
	case m.IsDir():
		return 0o755
	case m&fs.ModeSymlink != 0:
		return 0o777
	case m&0o111 != 0:
		return 0o755
	}
	return 0o644
}

func hdr(name string, typ byte, mode int64, epoch time.Time) *tar.Header {
	return &tar.Header{Name: name, Typeflag: typ, Mode: mode, ModTime: epoch, Format: tar.FormatPAX}
}

func writeDirTar(w io.Writer, dir, dest string, epoch time.Time) error {
	entries, err := walkSorted(dir)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	prefix := strings.Trim(path.Clean(dest), "/")
	// The parents of dest, so the layer unpacks on scratch too.
	if prefix != "" {
		parts := strings.Split(prefix, "/")
		for i := range parts {
			if err := tw.WriteHeader(hdr(strings.Join(parts[:i+1], "/")+"/", tar.TypeDir, 0o755, epoch)); err != nil {
				return err
			}
		}
	}
	for _, e := range entries {
		name := path.Join(prefix, e.rel)
		m := e.info.Mode()
		switch {
		case m.IsDir():
			if err := tw.WriteHeader(hdr(name+"/", tar.TypeDir, 0o755, epoch)); err != nil {
				return err
			}
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(filepath.Join(dir, filepath.FromSlash(e.rel)))
			if err != nil {
				return err
			}
			h := hdr(name, tar.TypeSymlink, 0o777, epoch)
			h.Linkname = target
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		default:
			f, err := os.Open(filepath.Join(dir, filepath.FromSlash(e.rel)))
			if err != nil {
				return err
			}
			h := hdr(name, tar.TypeReg, normMode(m), epoch)
			h.Size = e.info.Size()
			if err := tw.WriteHeader(h); err != nil {
				f.Close()
				return err
			}
			n, err := io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
			if n != h.Size {
				return fmt.Errorf("%s changed while being read", name)
			}
		}
	}
	return tw.Close()
}

// tarLayer is a layer from a tarball (plain or gzipped), its headers
// normalised as for directories. Entry order is kept: a hard link must
// follow its target, which sorting could break.
func tarLayer(file string, epoch time.Time, mt types.MediaType) (v1.Layer, error) {
	open := func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(normaliseTar(pw, file, epoch)) }()
		return pr, nil
	}
	// Read it once now, so a bad tarball is an error here, not mid-push.
	rc, _ := open()
	_, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err != nil {
		return nil, fmt.Errorf("tar %s: %w", file, err)
	}
	return tarball.LayerFromOpener(open, layerOpts(mt)...)
}

func normaliseTar(w io.Writer, file string, epoch time.Time) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		n := hdr(h.Name, h.Typeflag, normMode(h.FileInfo().Mode()), epoch)
		n.Linkname, n.Size = h.Linkname, h.Size
		n.Devmajor, n.Devminor = h.Devmajor, h.Devminor
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
		default:
			return fmt.Errorf("%s: tar entry type %q cannot go in a layer", h.Name, h.Typeflag)
		}
		if err := tw.WriteHeader(n); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	return tw.Close()
}
