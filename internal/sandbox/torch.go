package sandbox

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TorchCacheDir is where TorchLayer keeps the root filesystem it builds,
// between runs (as the benchmark layers are kept in /var/tmp/gpupin-bench).
// GPUPIN_TORCH_CACHE moves it.
var TorchCacheDir = "/var/tmp/gpupin-torch"

// TorchSuite is the Debian release whose python3-torch TorchLayer installs.
const TorchSuite = "bookworm"

// torchRootfs names the cached tarball by what went into it, so a change
// of the recipe builds a new one instead of reusing a stale one.
const torchRootfs = "rootfs-" + TorchSuite + "-python3-torch-v3.tar"

// TorchLayer is a root filesystem with Debian's python3-torch, a real
// PyTorch built without CUDA (torch.version.cuda is None), as one
// uncompressed layer. The first call on a machine builds it with
// mmdebstrap (about 1.25 GB, 1.5–2 minutes) under TorchCacheDir; later
// calls, in any process, reuse it. Built reports whether this call built it.
func TorchLayer(ctx context.Context) (layer v1.Layer, built bool, err error) {
	dir := TorchCacheDir
	if d := os.Getenv("GPUPIN_TORCH_CACHE"); d != "" {
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, false, err
	}
	// One builder at a time: test packages run in parallel processes.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, false, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	path := filepath.Join(dir, torchRootfs)
	if l, err := cachedLayer(path); err == nil {
		return l, false, nil
	}
	if err := buildTorchRootfs(ctx, path); err != nil {
		return nil, false, err
	}
	// Tarballs of older recipes would only fill the disk.
	if old, _ := filepath.Glob(filepath.Join(dir, "rootfs-*.tar*")); len(old) > 0 {
		for _, f := range old {
			if f != path && f != path+".sha256" {
				os.Remove(f)
			}
		}
	}
	l, err := cachedLayer(path)
	return l, true, err
}

// buildTorchRootfs runs mmdebstrap into a temporary file, records the
// tarball's digest beside it, and renames both into place.
func buildTorchRootfs(ctx context.Context, path string) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return fmt.Errorf("mmdebstrap is needed to build the torch test image (apt-get install mmdebstrap): %w", err)
	}
	full, tmp := path+".mmdebstrap.tar", path+".building.tar"
	for _, f := range []string{full, tmp} {
		os.Remove(f)
		defer os.Remove(f)
	}
	args := []string{"--mode=root", "--variant=apt", "--include=python3-torch"}
	// What no import reads; the rest of what it never loads is dropped
	// after the install (trimTorchRootfs), since maintainer scripts need it.
	for _, p := range []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*", "/usr/include/*"} {
		args = append(args, "--dpkgopt=path-exclude="+p)
	}
	args = append(args, TorchSuite, full)
	start := time.Now()
	if err := mmdebstrap(ctx, args); err != nil {
		return err
	}
	sum, size, dropped, err := trimTorchRootfs(full, tmp)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sandbox: built the torch root filesystem %s (%d MB, %d MB trimmed) in %s\n",
		path, size>>20, dropped>>20, time.Since(start).Round(time.Second))
	if err := os.WriteFile(path+".sha256", []byte(fmt.Sprintf("%s %d\n", sum, size)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// mmdebstrap runs mmdebstrap with args; its error carries the output's tail.
func mmdebstrap(ctx context.Context, args []string) error {
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tail := out.String()
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return fmt.Errorf("mmdebstrap %s: %w\n%s", strings.Join(args, " "), err, tail)
	}
	return nil
}

// trimTorchRootfs copies the tarball src to dst without what `import
// torch` never loads (measured on the host's python3-torch: the files it
// maps and the modules it imports; torch/bin/torch_shm_manager it does
// need): the Python packages' test suites, torch's C++ test binaries, and
// the graphics stack (Mesa drivers, LLVM,
// Z3, Intel media) that OpenCV's dependencies install. About a quarter of
// the tree, and of every pull of it. It returns dst's digest and size, and
// the bytes dropped.
func trimTorchRootfs(src, dst string) (sum string, size, dropped int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", 0, 0, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return "", 0, 0, err
	}
	defer out.Close()
	h := sha256.New()
	counted := &countWriter{w: io.MultiWriter(out, h)}
	tr, tw := tar.NewReader(bufio.NewReaderSize(in, 1<<20)), tar.NewWriter(counted)
	gone := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", 0, 0, fmt.Errorf("read %s: %w", src, err)
		}
		// A hard link to a dropped file would have nothing to point at.
		if unneededByTorch(hdr.Name) || hdr.Typeflag == tar.TypeLink && gone[hdr.Linkname] {
			gone[hdr.Name] = true
			dropped += hdr.Size
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", 0, 0, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return "", 0, 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return "", 0, 0, err
	}
	if err := out.Sync(); err != nil {
		return "", 0, 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), counted.n, dropped, nil
}

func unneededByTorch(name string) bool {
	name = strings.TrimPrefix(name, ".")
	const lib = "/usr/lib/x86_64-linux-gnu/"
	for _, p := range []string{lib + "dri/", lib + "mfx/", lib + "libLLVM-", lib + "libz3.so", lib + "libmfxhw64.so", "/usr/lib/python3/dist-packages/torch/bin/test_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return strings.HasPrefix(name, "/usr/lib/python3/dist-packages/") && strings.Contains(name, "/tests/")
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// cachedLayer opens a cached tarball whose digest file matches its size.
func cachedLayer(path string) (v1.Layer, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	rec, err := os.ReadFile(path + ".sha256")
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(rec))
	if len(f) != 2 {
		return nil, fmt.Errorf("%s.sha256: malformed", path)
	}
	size, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || size != fi.Size() {
		return nil, fmt.Errorf("%s: size %d, recorded %s", path, fi.Size(), f[1])
	}
	h, err := v1.NewHash("sha256:" + f[0])
	if err != nil {
		return nil, err
	}
	return &fileLayer{path: path, digest: h, size: size}, nil
}

// fileLayer is an uncompressed tar file as a layer. Uncompressed because
// gzip of a 1.25 GB tree costs tens of seconds of CPU on every push, and
// a loopback registry gains nothing from it; containerd takes
// application/vnd.oci.image.layer.v1.tar as it is.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.OCIUncompressedLayer, nil }
