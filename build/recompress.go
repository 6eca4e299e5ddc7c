package build

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Compression is how publish and build encode a variant's layers. Nodes
// pay for it on every pull: gzip decompresses at about 100–180 MB/s on one
// core, zstd several times faster, so a variant re-encoded once in CI
// provisions faster on every node. containerd reads zstd layers since 1.5.
type Compression string

const (
	// CompressionKeep leaves layers as the source has them.
	CompressionKeep Compression = ""
	// CompressionGzip re-encodes zstd and uncompressed layers as gzip.
	CompressionGzip Compression = "gzip"
	// CompressionZstd re-encodes gzip and uncompressed layers as zstd
	// (its default level), in OCI manifests.
	CompressionZstd Compression = "zstd"
)

// ParseCompression reads a --compression value.
func ParseCompression(s string) (Compression, error) {
	switch c := Compression(s); c {
	case CompressionKeep, CompressionGzip, CompressionZstd:
		return c, nil
	}
	return "", fmt.Errorf("compression %q: want gzip or zstd", s)
}

// layerCodec is what a layer media type says of its encoding.
func layerCodec(mt types.MediaType) (codec string, ok bool) {
	switch mt {
	case types.DockerLayer, types.OCILayer:
		return "gzip", true
	case types.OCILayerZStd:
		return "zstd", true
	case types.DockerUncompressedLayer, types.OCIUncompressedLayer:
		return "none", true
	}
	// Foreign and non-distributable layers are not ours to re-encode.
	return "", false
}

// spool holds the re-encoded layers on disk until they are pushed: a
// layer may be gigabytes, and its digest must be known before the
// manifest that names it can be written.
type spool struct {
	mu  sync.Mutex
	dir string
}

func (s *spool) file() (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir == "" {
		d, err := os.MkdirTemp("", "gpupin-recompress-")
		if err != nil {
			return nil, fmt.Errorf("spool for re-encoded layers: %w", err)
		}
		s.dir = d
	}
	return os.CreateTemp(s.dir, "layer-*")
}

// close removes every spooled layer.
func (s *spool) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir == "" {
		return nil
	}
	err := os.RemoveAll(s.dir)
	s.dir = ""
	return err
}

// recompress returns img with its layers encoded as to: a new manifest
// over the same config (the diff IDs do not change), in the same order,
// with the manifest's annotations kept. Each layer is read once, its
// uncompressed digest checked against the config's diff ID, and the new
// encoding spooled to disk. Layers already so encoded are kept as they are.
func recompress(img v1.Image, to Compression, sp *spool) (v1.Image, error) {
	if to == CompressionKeep {
		return img, nil
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	if len(layers) != len(m.Layers) || len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("the manifest has %d layers and the config %d diff IDs", len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	out := m.DeepCopy()
	docker := m.MediaType == types.DockerManifestSchema2
	if docker && to == CompressionZstd {
		// Docker's schema 2 has no zstd layer type: the re-encoded image
		// is an OCI image, with the same config bytes.
		out.MediaType = types.OCIManifestSchema1
		if out.Config.MediaType == types.DockerConfigJSON {
			out.Config.MediaType = types.OCIConfigJSON
		}
	}
	want := map[Compression]string{CompressionGzip: "gzip", CompressionZstd: "zstd"}[to]
	newLayers := make([]v1.Layer, len(layers))
	for i, l := range layers {
		d := m.Layers[i]
		codec, ok := layerCodec(d.MediaType)
		if !ok {
			if docker && to == CompressionZstd {
				return nil, fmt.Errorf("layer %d (%s) is of type %s, which an OCI manifest cannot carry; cannot re-encode this image as zstd", i, d.Digest, d.MediaType)
			}
			newLayers[i] = l
			continue
		}
		if codec == want {
			newLayers[i] = l
			if out.MediaType == types.OCIManifestSchema1 && d.MediaType == types.DockerLayer {
				out.Layers[i].MediaType = types.OCILayer // the same bytes
			}
			continue
		}
		rl, err := reencode(l, codec, to, cf.RootFS.DiffIDs[i], sp)
		if err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", i, d.Digest, err)
		}
		newLayers[i] = rl
		out.Layers[i].MediaType = rl.mt
		out.Layers[i].Digest = rl.digest
		out.Layers[i].Size = rl.size
		// URLs and the like name the old blob.
		out.Layers[i].URLs = nil
	}
	if out.MediaType == types.OCIManifestSchema1 {
		for i := range out.Layers {
			if out.Layers[i].MediaType == types.DockerUncompressedLayer {
				out.Layers[i].MediaType = types.OCIUncompressedLayer
			}
		}
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return &recompressedImage{manifest: out, raw: raw, rawCfg: rawCfg, cf: cf, layers: newLayers}, nil
}

// zstdWindow is the window re-encoded layers are written with. A node's
// decoder holds a frame's window (and more) per layer it extracts at
// once: zstd's default of 8 MiB would cost a pulling client tens of MiB,
// 2 MiB costs about 1 % in size on image content.
const zstdWindow = 2 << 20

// reencode decodes l (of codec from), checks its uncompressed digest, and
// spools it encoded as to.
func reencode(l v1.Layer, from string, to Compression, diffID v1.Hash, sp *spool) (*spooledLayer, error) {
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	defer rc.Close()
	var r io.Reader = bufio.NewReaderSize(rc, 1<<20)
	switch from {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer zr.Close()
		r = zr
	case "zstd":
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		defer zr.Close()
		r = zr
	}
	f, err := sp.file()
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		f.Close()
		if !keep {
			os.Remove(f.Name())
		}
	}()
	dz := sha256.New()
	cnt := &byteCount{}
	bw := bufio.NewWriterSize(io.MultiWriter(f, dz, cnt), 1<<20)
	var enc io.WriteCloser
	var mt types.MediaType
	switch to {
	case CompressionZstd:
		// The default level: near gzip's ratio, decoded several times
		// faster. Concurrency is bounded so CI memory stays small.
		enc, err = zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(zstdWindow), zstd.WithEncoderConcurrency(min(4, runtime.GOMAXPROCS(0))))
		mt = types.OCILayerZStd
	case CompressionGzip:
		enc, err = gzip.NewWriterLevel(bw, gzip.DefaultCompression)
		mt = types.OCILayer
	}
	if err != nil {
		return nil, err
	}
	du := sha256.New()
	if _, err := io.Copy(enc, io.TeeReader(r, du)); err != nil {
		return nil, fmt.Errorf("re-encode: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("re-encode: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	got := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(du.Sum(nil))}
	if got != diffID {
		return nil, fmt.Errorf("its uncompressed content is %s, but the config says %s: the source is corrupt", got, diffID)
	}
	keep = true
	return &spooledLayer{path: f.Name(), mt: mt, diffID: diffID, size: cnt.n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(dz.Sum(nil))}}, nil
}

type byteCount struct{ n int64 }

func (c *byteCount) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// spooledLayer is a re-encoded layer on disk.
type spooledLayer struct {
	path   string
	mt     types.MediaType
	digest v1.Hash
	diffID v1.Hash
	size   int64
}

func (l *spooledLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *spooledLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *spooledLayer) Size() (int64, error)                { return l.size, nil }
func (l *spooledLayer) MediaType() (types.MediaType, error) { return l.mt, nil }
func (l *spooledLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *spooledLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	var r io.ReadCloser
	if l.mt == types.OCILayerZStd {
		zr, err := zstd.NewReader(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		r = zr.IOReadCloser()
	} else {
		zr, err := gzip.NewReader(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		r = zr
	}
	return struct {
		io.Reader
		io.Closer
	}{r, closers{r, f}}, nil
}

type closers []io.Closer

func (c closers) Close() error {
	var errs []error
	for _, x := range c {
		errs = append(errs, x.Close())
	}
	return errors.Join(errs...)
}

// recompressedImage is an image whose manifest was rewritten over new
// layers; its config is the source's, byte for byte.
type recompressedImage struct {
	manifest *v1.Manifest
	raw      []byte
	rawCfg   []byte
	cf       *v1.ConfigFile
	layers   []v1.Layer
}

func (r *recompressedImage) Layers() ([]v1.Layer, error)         { return r.layers, nil }
func (r *recompressedImage) MediaType() (types.MediaType, error) { return r.manifest.MediaType, nil }
func (r *recompressedImage) Size() (int64, error)                { return int64(len(r.raw)), nil }
func (r *recompressedImage) ConfigName() (v1.Hash, error)        { return r.manifest.Config.Digest, nil }
func (r *recompressedImage) ConfigFile() (*v1.ConfigFile, error) { return r.cf.DeepCopy(), nil }
func (r *recompressedImage) RawConfigFile() ([]byte, error)      { return r.rawCfg, nil }
func (r *recompressedImage) Manifest() (*v1.Manifest, error)     { return r.manifest.DeepCopy(), nil }
func (r *recompressedImage) RawManifest() ([]byte, error)        { return r.raw, nil }
func (r *recompressedImage) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(r.raw))
	return h, err
}

func (r *recompressedImage) LayerByDigest(h v1.Hash) (v1.Layer, error) {
	if h == r.manifest.Config.Digest {
		return configLayer{raw: r.rawCfg, digest: h, mt: r.manifest.Config.MediaType}, nil
	}
	for i, d := range r.manifest.Layers {
		if d.Digest == h {
			return r.layers[i], nil
		}
	}
	return nil, fmt.Errorf("no layer %s in the re-encoded image", h)
}

func (r *recompressedImage) LayerByDiffID(h v1.Hash) (v1.Layer, error) {
	for i, d := range r.cf.RootFS.DiffIDs {
		if d == h {
			return r.layers[i], nil
		}
	}
	return nil, fmt.Errorf("no layer of diff ID %s in the re-encoded image", h)
}

// configLayer serves the config blob as a layer, as remote.Write asks.
type configLayer struct {
	raw    []byte
	digest v1.Hash
	mt     types.MediaType
}

func (c configLayer) Digest() (v1.Hash, error)            { return c.digest, nil }
func (c configLayer) DiffID() (v1.Hash, error)            { return c.digest, nil }
func (c configLayer) Size() (int64, error)                { return int64(len(c.raw)), nil }
func (c configLayer) MediaType() (types.MediaType, error) { return c.mt, nil }
func (c configLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(c.raw)), nil
}
func (c configLayer) Uncompressed() (io.ReadCloser, error) { return c.Compressed() }
