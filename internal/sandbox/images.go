package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BusyboxPath is Debian's busybox-static: a static binary, so images built
// from it run with no libc.
const BusyboxPath = "/bin/busybox"

var applets = []string{"sh", "cat", "ls", "sleep", "echo", "awk", "touch", "env", "id", "mkdir",
	"head", "tail", "tr", "sed", "grep", "printf", "true", "false", "dd", "wc", "cut", "ip", "ifconfig", "rm", "test", "["}

var (
	bbOnce  sync.Once
	bbLayer v1.Layer
	bbErr   error
)

// BusyboxLayer is a layer with busybox and its common applets under /bin,
// and the directories a container needs.
func BusyboxLayer() (v1.Layer, error) {
	bbOnce.Do(func() {
		bin, err := os.ReadFile(BusyboxPath)
		if err != nil {
			bbErr = fmt.Errorf("busybox-static is needed for test images (apt-get install busybox-static): %w", err)
			return
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		epoch := time.Unix(0, 0)
		for _, d := range []string{"bin/", "tmp/", "etc/", "dev/", "proc/", "sys/", "usr/", "usr/lib/"} {
			mode := int64(0o755)
			if d == "tmp/" {
				mode = 0o1777
			}
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: epoch})
		}
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: epoch})
		tw.Write(bin)
		for _, a := range applets {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch})
		}
		tw.Close()
		data := buf.Bytes()
		bbLayer, bbErr = tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		})
	})
	return bbLayer, bbErr
}

// FileLayer is a layer holding the given files (path → content), mode 0644.
func FileLayer(files map[string][]byte) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for p, c := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(c)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		tw.Write(c)
	}
	tw.Close()
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// RandomLayer is an uncompressed-tar layer of incompressible bytes, gzipped
// (to nothing smaller), for pull benchmarks.
func RandomLayer(size int64) (v1.Layer, error) {
	payload := make([]byte, size)
	if _, err := rand.Read(payload); err != nil {
		return nil, err
	}
	return FileLayer(map[string][]byte{fmt.Sprintf("payload/%d.bin", time.Now().UnixNano()): payload})
}

// ImageSpec describes a test image: busybox plus env, labels and layers.
type ImageSpec struct {
	OS, Arch   string // default linux/amd64
	Env        []string
	Labels     map[string]string
	Entrypoint []string
	Cmd        []string
	Layers     []v1.Layer
	// Annotations go on the manifest itself.
	Annotations map[string]string
}

// Image builds a test image: BareImage over a static busybox layer, with
// PATH=/bin before spec.Env.
func Image(spec ImageSpec) (v1.Image, error) {
	bb, err := BusyboxLayer()
	if err != nil {
		return nil, err
	}
	spec.Layers = append([]v1.Layer{bb}, spec.Layers...)
	spec.Env = append([]string{"PATH=/bin"}, spec.Env...)
	return BareImage(spec)
}

// IndexEntry is one child of a pushed index.
type IndexEntry struct {
	Image       v1.Image
	Annotations map[string]string
	Platform    *v1.Platform
}

// PushIndex pushes the images and an OCI index of them under ref, and
// returns the index digest. opts reach a registry the defaults do not (a
// TLS one: Distribution.Remote, CA.Remote).
func PushIndex(ctx context.Context, ref string, entries []IndexEntry, opts ...remote.Option) (v1.Hash, error) {
	opts = append([]remote.Option{remote.WithContext(ctx)}, opts...)
	tag, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	var adds []mutate.IndexAddendum
	for _, e := range entries {
		if err := remote.Write(tag.Context().Digest(mustDigest(e.Image).String()), e.Image, opts...); err != nil {
			return v1.Hash{}, fmt.Errorf("push child: %w", err)
		}
		// mutate fills the rest of the descriptor (partial.Descriptor).
		adds = append(adds, mutate.IndexAddendum{Add: e.Image, Descriptor: v1.Descriptor{Annotations: e.Annotations, Platform: e.Platform}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	if err := remote.WriteIndex(tag, idx, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push index: %w", err)
	}
	return idx.Digest()
}

// PushImage pushes a single image under ref (opts as PushIndex's).
func PushImage(ctx context.Context, ref string, img v1.Image, opts ...remote.Option) (v1.Hash, error) {
	tag, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(tag, img, append([]remote.Option{remote.WithContext(ctx)}, opts...)...); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// PushRaw pushes raw manifest bytes under ref with a media type (hostile
// registries, malformed manifests).
func PushRaw(ctx context.Context, ref string, mt types.MediaType, manifest []byte) error {
	tag, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	return remote.Put(tag, rawManifest{mt: mt, b: manifest}, remote.WithContext(ctx))
}

type rawManifest struct {
	mt types.MediaType
	b  []byte
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.b, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// PushBlob uploads a blob into a repository.
func PushBlob(ctx context.Context, repo string, data []byte, mt types.MediaType) (v1.Hash, error) {
	r, err := name.NewRepository(repo)
	if err != nil {
		return v1.Hash{}, err
	}
	l := static.NewLayer(data, mt)
	if err := remote.WriteLayer(r, l, remote.WithContext(ctx)); err != nil {
		return v1.Hash{}, err
	}
	return l.Digest()
}

func mustDigest(img v1.Image) v1.Hash {
	d, err := img.Digest()
	if err != nil {
		panic(err)
	}
	return d
}
