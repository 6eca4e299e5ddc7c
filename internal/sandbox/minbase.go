package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// MinbaseCacheDir is where MinbaseTar keeps the root filesystem it builds,
// across test runs (GPUPIN_MINBASE_CACHE overrides it).
var MinbaseCacheDir = "/var/tmp/gpupin-minbase"

// minbaseTar names the cached tarball by its recipe.
const minbaseTar = "rootfs-" + TorchSuite + "-minbase-v1.tar"

// MinbaseTar is the path of an uncompressed tarball of a Debian minbase
// root filesystem (mmdebstrap --variant=minbase, documentation left out):
// a real distribution's tree, with its setuid programs, hard links, device
// nodes and directory modes. The first call on a machine builds it (under
// a minute, about 150 MB); later calls, in any process, reuse it.
func MinbaseTar(ctx context.Context) (string, error) {
	dir := MinbaseCacheDir
	if d := os.Getenv("GPUPIN_MINBASE_CACHE"); d != "" {
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// One builder at a time: test packages run in parallel processes.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	path := filepath.Join(dir, minbaseTar)
	if _, err := cachedLayer(path); err == nil {
		return path, nil
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return "", fmt.Errorf("mmdebstrap is needed to build the minbase root filesystem (apt-get install mmdebstrap): %w", err)
	}
	tmp := path + ".building.tar"
	os.Remove(tmp)
	defer os.Remove(tmp)
	args := []string{"--mode=root", "--variant=minbase"}
	for _, p := range []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*"} {
		args = append(args, "--dpkgopt=path-exclude="+p)
	}
	args = append(args, TorchSuite, tmp)
	start := time.Now()
	if err := mmdebstrap(ctx, args); err != nil {
		return "", err
	}
	f, err := os.Open(tmp)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	size, err := io.Copy(h, f)
	f.Close()
	if err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "sandbox: built the minbase root filesystem %s (%d MB) in %s\n", path, size>>20, time.Since(start).Round(time.Second))
	if err := os.WriteFile(path+".sha256", []byte(fmt.Sprintf("%s %d\n", hex.EncodeToString(h.Sum(nil)), size)), 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
