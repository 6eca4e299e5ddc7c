package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ProbeBinaries are the probe programs gpupin mounts into images, as the
// Makefile builds them: static or glibc-only Go binaries (CGO_ENABLED=0).
var ProbeBinaries = []string{"gpupin-cuda-probe", "gpupin-sim-probe"}

// BuildProbeBinaries builds ProbeBinaries into dir with the go command,
// from the module this code is part of. gpupin finds them there when
// dir is $GPUPIN_LIBDIR (probe.EnvLibDir) or beside its executable.
func BuildProbeBinaries(ctx context.Context, dir string) error {
	if _, err := exec.LookPath("go"); err != nil {
		return fmt.Errorf("the go command is needed to build the probe binaries: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range ProbeBinaries {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, name), "github.com/gpupin/gpupin/cmd/"+name)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", name, err, out)
		}
	}
	return nil
}

// BareImage builds a test image of spec.Layers alone, without the busybox
// layer Image adds: a scratch image, a distroless one, or a whole root
// filesystem. Its environment is spec.Env, PATH included.
func BareImage(spec ImageSpec) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, spec.Layers...)
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if spec.OS != "" {
		cf.OS = spec.OS
	}
	if spec.Arch != "" {
		cf.Architecture = spec.Arch
	}
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config.Env = spec.Env
	cf.Config.Labels = spec.Labels
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	if len(spec.Annotations) > 0 {
		img = mutate.Annotations(img, spec.Annotations).(v1.Image)
	}
	return img, nil
}

// GlibcLayer is the host's glibc dynamic loader and the libraries
// gpupin-cuda-probe links (libc, libdl, libpthread), at the paths they have
// on the host: with it, an image without a shell or anything else (a
// distroless base) runs glibc programs.
func GlibcLayer() (v1.Layer, error) {
	loader, err := hostLoader()
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(loader)
	if err != nil {
		return nil, fmt.Errorf("glibc loader %s: %w", loader, err)
	}
	libDir := filepath.Dir(real)
	files := map[string]string{strings.TrimPrefix(loader, "/"): real}
	for _, lib := range []string{"libc.so.6", "libdl.so.2", "libpthread.so.0"} {
		p, err := filepath.EvalSymlinks(filepath.Join(libDir, lib))
		if err != nil {
			return nil, fmt.Errorf("glibc library %s: %w", lib, err)
		}
		files[strings.TrimPrefix(filepath.Join(libDir, lib), "/")] = p
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for name := range files {
		for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range append(slices.Sorted(maps.Keys(dirs)), "tmp") {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch})
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data, err := os.ReadFile(files[name])
		if err != nil {
			return nil, err
		}
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch})
		tw.Write(data)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// hostLoader is the ELF interpreter the host's own programs ask for.
func hostLoader() (string, error) {
	bin, err := exec.LookPath("true")
	if err != nil {
		return "", err
	}
	f, err := elf.Open(bin)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", err
			}
			return string(bytes.TrimRight(b, "\x00")), nil
		}
	}
	return "", fmt.Errorf("%s names no ELF interpreter: is the host's glibc static?", bin)
}
