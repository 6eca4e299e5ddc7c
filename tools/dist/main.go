// Command dist makes gpupin's release layout for nodes without Kubernetes:
// a tarball and a .deb (nfpm) of the same files. It is a module of its
// own, so nfpm's dependencies stay out of gpupin's.
//
//	go run . -root ../.. -bin ../../bin -out ../../dist -version 0.1.0
//
// What it installs, and where gpupin looks for it:
//
//	/usr/bin/gpupin
//	/usr/bin/kubectl-gpupin -> gpupin                     (kubectl gpupin: the fleet's table)
//	/usr/lib/gpupin/gpupin-cuda-probe, gpupin-sim-probe   (probe.Build's /usr/lib/gpupin)
//	/lib/systemd/system/gpupin-agent.service               (not enabled, not started)
//	/etc/gpupin/agent.yaml                                  (a conffile, all comments)
//
// The package has no maintainer scripts: nothing starts on install.
package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
)

// entry is one file of the layout.
type entry struct {
	src, dst string
	mode     os.FileMode
	conf     bool   // a conffile: kept on upgrade and on dpkg -r
	content  []byte // instead of src
	link     string // a symbolic link to this target instead of a file
}

func main() {
	root := flag.String("root", ".", "gpupin's checkout")
	bin := flag.String("bin", "bin", "where make build put the binaries")
	out := flag.String("out", "dist", "output directory")
	version := flag.String("version", "0.1.0", "package version")
	arch := flag.String("arch", "amd64", "Debian architecture of the binaries")
	flag.Parse()
	if err := run(*root, *bin, *out, *version, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "dist:", err)
		os.Exit(1)
	}
}

func run(root, bin, out, version, arch string) error {
	entries, err := layout(root, bin)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	tarball := filepath.Join(out, fmt.Sprintf("gpupin_%s_linux_%s.tar.gz", version, arch))
	if err := writeTarball(tarball, entries); err != nil {
		return fmt.Errorf("tarball: %w", err)
	}
	deb := filepath.Join(out, fmt.Sprintf("gpupin_%s_%s.deb", version, arch))
	if err := writeDeb(deb, entries, version, arch); err != nil {
		return fmt.Errorf("deb: %w", err)
	}
	fmt.Println(tarball)
	fmt.Println(deb)
	return nil
}

// layout lists the release's files. The unit in deploy/systemd names
// /usr/local/bin/gpupin, where a hand install puts it; the package's
// gpupin is /usr/bin/gpupin, so its copy of the unit says that.
func layout(root, bin string) ([]entry, error) {
	unit, err := os.ReadFile(filepath.Join(root, "deploy/systemd/gpupin-agent.service"))
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/gpupin ") {
		return nil, errors.New("deploy/systemd/gpupin-agent.service: no ExecStart=/usr/local/bin/gpupin to point at /usr/bin/gpupin")
	}
	unit = []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/gpupin", "/usr/bin/gpupin"))
	es := []entry{
		{src: filepath.Join(bin, "gpupin"), dst: "/usr/bin/gpupin", mode: 0o755},
		// kubectl runs kubectl-gpupin on PATH for `kubectl gpupin`; gpupin
		// run under that name acts as `gpupin fleet` (docs/fleet.md).
		{dst: "/usr/bin/kubectl-gpupin", mode: 0o777, link: "gpupin"},
		{src: filepath.Join(bin, "gpupin-cuda-probe"), dst: "/usr/lib/gpupin/gpupin-cuda-probe", mode: 0o755},
		{src: filepath.Join(bin, "gpupin-sim-probe"), dst: "/usr/lib/gpupin/gpupin-sim-probe", mode: 0o755},
		{dst: "/lib/systemd/system/gpupin-agent.service", mode: 0o644, content: unit},
		{src: filepath.Join(root, "deploy/systemd/agent.yaml"), dst: "/etc/gpupin/agent.yaml", mode: 0o644, conf: true},
	}
	for i, e := range es {
		if e.content != nil || e.link != "" {
			continue
		}
		data, err := os.ReadFile(e.src)
		if err != nil {
			return nil, fmt.Errorf("%w (make build first)", err)
		}
		es[i].content = data
	}
	return es, nil
}

// writeTarball writes the layout under gpupin/, root-owned, for
// `tar -C / --strip-components=1 -xzf` or a look inside.
func writeTarball(path string, es []entry) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	mtime := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, e := range es {
		name := "gpupin" + e.dst
		var parents []string
		for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		if e.link != "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: e.link, Mode: int64(e.mode), ModTime: mtime}); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(e.mode), Size: int64(len(e.content)), ModTime: mtime}); err != nil {
			return err
		}
		if _, err := tw.Write(e.content); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func writeDeb(path string, es []entry, version, arch string) error {
	tmp, err := os.MkdirTemp("", "gpupin-dist-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var contents files.Contents
	for i, e := range es {
		if e.link != "" {
			// nfpm's symlink: Source is the target, Destination the link.
			contents = append(contents, &files.Content{Type: files.TypeSymlink, Source: e.link, Destination: e.dst})
			continue
		}
		// nfpm packages files from disk.
		src := filepath.Join(tmp, fmt.Sprint(i))
		if err := os.WriteFile(src, e.content, e.mode); err != nil {
			return err
		}
		c := &files.Content{Source: src, Destination: e.dst, FileInfo: &files.ContentFileInfo{Mode: e.mode}}
		if e.conf {
			c.Type = files.TypeConfigNoReplace
		}
		contents = append(contents, c)
	}
	info := nfpm.WithDefaults(&nfpm.Info{
		Name:       "gpupin",
		Arch:       arch,
		Platform:   "linux",
		Version:    version,
		Section:    "admin",
		Priority:   "optional",
		Maintainer: "gpupin <gpupin@users.noreply.github.com>",
		Description: "choose, prove and pin GPU inference engine images on NVIDIA nodes\n" +
			"gpupin reads the driver through NVML, chooses the CUDA variant of an\n" +
			"engine image the node can run, pulls it through containerd, proves it\n" +
			"with a GPU probe and pins it by digest. The agent's systemd unit is\n" +
			"installed, not enabled.",
		Homepage: "https://github.com/gpupin/gpupin",
		License:  "Apache-2.0",
		Overridables: nfpm.Overridables{
			Contents:   contents,
			Recommends: []string{"containerd | containerd.io", "runc"},
		},
	})
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return err
	}
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pkg.Package(info, f); err != nil {
		return err
	}
	return f.Close()
}
