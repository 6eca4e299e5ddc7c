package pull_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	"golang.org/x/sys/unix"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/pull"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// The root filesystem gpupin unpacks is containerd's: the same image,
// pulled by ctr into another namespace of the same daemon, gives the same
// files, layer by layer and merged, on every GPUPIN_UNPACK strategy —
// modes with setuid, setgid and sticky bits, owners (large ones too),
// extended attributes (security.capability among them), hard-link groups,
// device numbers, symbolic link targets, sizes, content, modification
// times, whiteouts and opaque markers. The layers carry every kind of tar
// entry, and later layers write into directories they do not name (as
// crane append and hand-made tars do): those directories keep what the
// layers under them gave them. A Debian minbase root filesystem with such
// a layer on top is the real-world case (/tmp, /root, /var/log).
func TestUnpackMatchesCtrPull(t *testing.T) {
	ctx := context.Background()
	d := testenv.Containerd(t)
	reg := testenv.Registry(t)
	since := time.Now()
	base, err := sandbox.MinbaseTar(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sets := []struct {
		name   string
		layers func(*testing.T, compression.Compression, string) []v1.Layer
	}{
		{"entries", entryLayers},
		{"minbase", func(t *testing.T, comp compression.Compression, salt string) []v1.Layer {
			return minbaseLayers(t, comp, salt, base)
		}},
	}
	for _, set := range sets {
		for _, comp := range []compression.Compression{compression.GZip, compression.ZStd} {
			for _, mode := range []string{"", "keep", "serial", "daemon", "containerd"} {
				if set.name == "minbase" && comp == compression.ZStd && mode != "" {
					continue // the decompressor is the entries' concern; one zstd pull of a real tree
				}
				t.Run(set.name+"/"+string(comp)+"/"+mode, func(t *testing.T) {
					// Layers of this subtest's own: a blob another pull left
					// in the content store would be applied from there, not
					// extracted as it downloads.
					salt := t.Name() + since.String()
					img, err := sandbox.BareImage(sandbox.ImageSpec{Layers: set.layers(t, comp, salt)})
					if err != nil {
						t.Fatal(err)
					}
					dg, err := sandbox.PushImage(ctx, reg.Host+"/rootfs-"+set.name+":latest", img)
					if err != nil {
						t.Fatal(err)
					}
					ref := reg.Host + "/rootfs-" + set.name + "@" + dg.String()
					cfg, err := img.ConfigFile()
					if err != nil {
						t.Fatal(err)
					}
					var diffIDs []digest.Digest
					for _, h := range cfg.RootFS.DiffIDs {
						diffIDs = append(diffIDs, digest.Digest(h.String()))
					}

					rt := strategyRuntime(t, mode)
					ls, err := rt.LayerStorage(ctx)
					if err != nil {
						t.Fatal(err)
					}
					before, movedBefore := pull.Fallbacks(), pull.Moves()
					if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
						t.Fatal(err)
					}
					// Below containerd 2.2 the layers extracted at once are
					// moved onto their parents: what is compared below is
					// what the moves made.
					if strings.Contains(ls.Unpack, "moved onto the parent") && pull.Moves() == movedBefore {
						t.Errorf("%s: no layer was moved onto its parent", ls.Unpack)
					}
					// The comparison is of gpupin's own extraction: the
					// default may leave a layer to the daemon for cause
					// (seen once, on a loaded machine), never every layer.
					if (mode == "" || mode == "keep") && os.Geteuid() == 0 {
						if n := pull.Fallbacks() - before; n >= int64(len(diffIDs)) {
							t.Errorf("all %d layers were applied by the daemon, none extracted here", n)
						} else if n > 0 {
							t.Logf("%d of %d layers were applied by the daemon", n, len(diffIDs))
						}
					}
					// containerd's own, second: ctr pull, which unpacks as
					// the daemon does, from the registry or the store.
					ctrNS := rt.Namespace() + "-ctr"
					out, err := exec.CommandContext(ctx, d.Ctr(), "-a", d.Address, "-n", ctrNS, "images", "pull", "--plain-http", ref).CombinedOutput()
					if err != nil {
						t.Fatalf("ctr pull: %v\n%s", err, out)
					}
					compareChains(t, rt.Client(), namespaces.WithNamespace(ctx, ctrNS), namespaces.WithNamespace(ctx, rt.Namespace()), identity.ChainIDs(diffIDs), since)
				})
			}
		}
	}
}

// compareChains compares each layer's own directory, then the merged
// view, of chain in namespace want (ctr's) and got (gpupin's).
func compareChains(t *testing.T, c *client.Client, want, got context.Context, chain []digest.Digest, since time.Time) {
	t.Helper()
	sn := c.SnapshotService("overlayfs")
	view := func(ctx context.Context, id digest.Digest) []mount.Mount {
		key := fmt.Sprintf("t-view-%d-%s", time.Now().UnixNano(), id)
		m, err := sn.View(ctx, key, id.String())
		if err != nil {
			t.Fatalf("view %s: %v", id, err)
		}
		t.Cleanup(func() { sn.Remove(context.WithoutCancel(ctx), key) })
		return m
	}
	for i, id := range chain {
		w, g := pull.LowerDirs(view(want, id)), pull.LowerDirs(view(got, id))
		if len(w) == 0 || len(g) == 0 {
			t.Fatalf("layer %d: no layer directory (ctr %v, gpupin %v)", i, w, g)
		}
		diffTrees(t, fmt.Sprintf("layer %d", i), w[0], g[0], since, true)
	}
	top := chain[len(chain)-1]
	mnt := func(ctx context.Context) string {
		dir := t.TempDir()
		if err := mount.All(view(ctx, top), dir); err != nil {
			t.Fatalf("mount: %v", err)
		}
		t.Cleanup(func() { mount.UnmountAll(dir, 0) })
		return dir
	}
	diffTrees(t, "merged", mnt(want), mnt(got), since, false)
}

// diffTrees fails t with every path whose description differs.
func diffTrees(t *testing.T, what, want, got string, since time.Time, raw bool) {
	t.Helper()
	w, g := describeTree(t, want, since, raw), describeTree(t, got, since, raw)
	var diffs []string
	for p, dw := range w {
		if dg, ok := g[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%q: only under ctr: %s", p, dw))
		} else if dg != dw {
			diffs = append(diffs, fmt.Sprintf("%q:\n\tctr:    %s\n\tgpupin: %s", p, dw, dg))
		}
	}
	for p, dg := range g {
		if _, ok := w[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%q: only under gpupin: %s", p, dg))
		}
	}
	if len(w) < 2 {
		t.Errorf("%s: ctr's tree %s holds %d paths: nothing compared", what, want, len(w))
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		if len(diffs) > 30 {
			diffs = append(diffs[:30], fmt.Sprintf("… and %d more", len(diffs)-30))
		}
		t.Errorf("%s: %d of %d paths differ from ctr pull's:\n%s", what, len(diffs), len(w), strings.Join(diffs, "\n"))
	}
}

// describeTree describes every path under root: type, mode bits, owner,
// extended attributes, and by type size and content hash, link target,
// device number, modification time, hard-link group. A directory's
// modification time counts only where ctr's is older than the test (set
// from a header or a parent layer, not by the extraction's own writes).
// raw: a layer's own directory, whose opaque markers (trusted.overlay.
// opaque) count; overlayfs's other bookkeeping attributes do not.
func describeTree(t *testing.T, root string, since time.Time, raw bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	links := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		m := fi.Mode()
		var b strings.Builder
		fmt.Fprintf(&b, "%s %04o", typeChar(m), uint32(m.Perm())|specialBits(m))
		fmt.Fprintf(&b, " %d:%d", st.Uid, st.Gid)
		mtime := time.Unix(st.Mtim.Unix())
		switch {
		case m.IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " size=%d sha256=%s mtime=%d", fi.Size(), hex.EncodeToString(h.Sum(nil))[:16], mtime.UnixNano())
			if st.Nlink > 1 {
				links[st.Ino] = append(links[st.Ino], rel)
			}
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " -> %q mtime=%d", target, mtime.UnixNano())
		case m&fs.ModeDevice != 0:
			fmt.Fprintf(&b, " dev=%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case m.IsDir():
			fmt.Fprintf(&b, " mtime@%d", mtime.UnixNano())
		}
		for _, kv := range xattrs(t, p, raw) {
			b.WriteString(" " + kv)
		}
		out[rel] = b.String()
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	for _, group := range links {
		slices.Sort(group)
		for _, p := range group {
			out[p] += fmt.Sprintf(" links=%q×%d", group[0], len(group))
		}
	}
	// A directory's time is compared only where ctr's was set from the
	// image: the caller's tree is ctr's when its keys are the same, so
	// both are reduced the same way by reduceDirTimes.
	return reduceDirTimes(out, since)
}

// reduceDirTimes drops the directory modification times that are not
// older than since: those the extraction itself set, which differ run by
// run whoever unpacks.
func reduceDirTimes(out map[string]string, since time.Time) map[string]string {
	for p, s := range out {
		i := strings.Index(s, " mtime@")
		if i < 0 {
			continue
		}
		rest := s[i+len(" mtime@"):]
		j := strings.IndexByte(rest, ' ')
		if j < 0 {
			j = len(rest)
		}
		var ns int64
		fmt.Sscan(rest[:j], &ns)
		if ns >= since.UnixNano() {
			out[p] = s[:i] + " mtime=(unpack)" + rest[j:]
		} else {
			out[p] = s[:i] + " mtime=" + rest[:j] + rest[j:]
		}
	}
	return out
}

func typeChar(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "d"
	case m&fs.ModeSymlink != 0:
		return "l"
	case m&fs.ModeCharDevice != 0:
		return "c"
	case m&fs.ModeDevice != 0:
		return "b"
	case m&fs.ModeNamedPipe != 0:
		return "p"
	case m&fs.ModeSocket != 0:
		return "s"
	}
	return "-"
}

func specialBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// xattrs lists p's extended attributes as key=hex, sorted.
func xattrs(t *testing.T, p string, raw bool) []string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		if err == unix.ENOTSUP {
			return nil
		}
		t.Fatalf("listxattr %s: %v", p, err)
	}
	var kvs []string
	for _, k := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if k == "" || (strings.HasPrefix(k, "trusted.overlay.") && !(raw && k == "trusted.overlay.opaque")) {
			continue
		}
		v := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, k, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, k, err)
		}
		kvs = append(kvs, k+"="+hex.EncodeToString(v[:vn]))
	}
	sort.Strings(kvs)
	return kvs
}

// hdr is one tar entry of a test layer.
type hdr struct {
	tar.Header
	body string
}

func file(name string, mode int64, body string) hdr {
	return hdr{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, body: body}
}

func dir(name string, mode int64, uid, gid int) hdr {
	return hdr{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid}}
}

func (h hdr) xattr(k, v string) hdr {
	if h.PAXRecords == nil {
		h.PAXRecords = map[string]string{}
	}
	h.PAXRecords["SCHILY.xattr."+k] = v
	return h
}

func (h hdr) owned(uid, gid int) hdr { h.Uid, h.Gid = uid, gid; return h }

func (h hdr) at(tm time.Time) hdr { h.ModTime = tm; return h }

func (h hdr) format(f tar.Format) hdr { h.Format = f; return h }

// layerOf writes the entries as a tar compressed as comp.
func layerOf(t *testing.T, comp compression.Compression, entries ...hdr) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Date(2020, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, e := range entries {
		h := e.Header
		if h.ModTime.IsZero() {
			h.ModTime = epoch
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("%q: %v", h.Name, err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return rawLayer(t, comp, buf.Bytes())
}

// rawLayer is the tar data compressed as comp.
func rawLayer(t *testing.T, comp compression.Compression, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompression(comp))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// capNetBindService is a security.capability value (VFS_CAP_REVISION_2,
// effective, permitted CAP_NET_BIND_SERVICE), as setcap writes it.
const capNetBindService = "\x01\x00\x00\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

// entryLayers are three layers with every kind of tar entry; the second
// and third name no parent directory of what they write. The third also
// replaces a directory it wrote into without naming it by a symbolic link
// to a directory of the host's: the host's must be left as it was.
func entryLayers(t *testing.T, comp compression.Compression, salt string) []v1.Layer {
	host := hostDirUntouched(t)
	y2021 := time.Date(2021, 6, 7, 8, 9, 10, 0, time.UTC)
	long := "long/" + strings.Repeat("n", 120) + "/" + strings.Repeat("f", 110)
	return []v1.Layer{
		layerOf(t, comp,
			dir("./", 0o755, 0, 0),
			file(".salt", 0o644, salt),
			dir("tmp/", 0o1777, 0, 0),
			dir("home/", 0o755, 0, 0),
			dir("home/user/", 0o700, 1000, 1000),
			dir("d-0700/", 0o700, 1234, 5678),
			dir("d-inh/", 0o710, 1111, 2222).xattr("user.inh", "inherited"),
			dir("d-opq/", 0o770, 4, 4).xattr("user.o", "1").at(y2021),
			file("d-opq/old", 0o644, "hidden by layer 1's opaque marker\n"),
			dir("d-opq2/", 0o770, 4, 4).xattr("user.o", "2").at(y2021),
			file("d-opq2/old", 0o644, "hidden\n"),
			dir("hdr/", 0o700, 5, 5).xattr("user.l", "lower").xattr("user.both", "lower"),
			file("f2d", 0o640, "a file, a directory in layer 1\n"),
			dir("g/", 0o2775, 0, 50),
			dir("e/", 0o755, 0, 0),
			dir("e/tmp/", 0o700, 1234, 0),
			dir("s/", 0o2770, 0, 60),
			file("suid", 0o4755, "setuid\n"),
			file("sgid", 0o2711, "setgid\n"),
			dir("sticky/", 0o1755, 0, 0),
			file("big-ids", 0o600, "large owner\n").owned(4000000000, 4000000001),
			file("cap", 0o755, "capable\n").xattr("security.capability", capNetBindService),
			file("h1", 0o644, "one inode, three names\n"),
			hdr{Header: tar.Header{Typeflag: tar.TypeLink, Name: "h2", Linkname: "h1"}},
			hdr{Header: tar.Header{Typeflag: tar.TypeLink, Name: "h3", Linkname: "h1"}},
			dir("dev/", 0o755, 0, 0),
			hdr{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
			hdr{Header: tar.Header{Typeflag: tar.TypeBlock, Name: "dev/loop0", Mode: 0o660, Devmajor: 7, Devminor: 0, Gid: 6}},
			hdr{Header: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o600}},
			dir("long/", 0o755, 0, 0),
			file(long, 0o644, "a PAX path\n").format(tar.FormatPAX),
			file("gnu-"+strings.Repeat("g", 120), 0o644, "a GNU long name\n").format(tar.FormatGNU),
			file("bytes-\xff\xfe", 0o644, "a name that is not UTF-8\n").format(tar.FormatGNU),
			hdr{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "abs", Linkname: "/etc/passwd"}},
			hdr{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "rel", Linkname: "../tmp"}},
			hdr{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "lnk", Linkname: "d-0700"}},
			file("x-gone", 0o644, "whited out by layer 1\n"),
		),
		layerOf(t, comp,
			file(".salt-1", 0o644, salt),
			file("tmp/from-layer-1", 0o644, "in /tmp\n"),
			file("home/user/.profile", 0o644, "umask 077\n").owned(1000, 1000),
			file("d-0700/f", 0o600, "x\n"),
			file("d-inh/sub/f", 0o644, "x\n"),
			file("d-opq/.wh..wh..opq", 0o644, ""),
			file("d-opq2/.wh..wh..opq", 0o644, ""),
			file("d-opq2/new", 0o644, "new\n"),
			file(".wh.x-gone", 0o644, ""),
			dir("f2d/", 0o750, 0, 0),
			file("f2d/a", 0o644, "a\n"),
			file("g/new", 0o664, "in a setgid directory\n"),
			file("h5", 0o644, "linked within the layer\n"),
			hdr{Header: tar.Header{Typeflag: tar.TypeLink, Name: "h4", Linkname: "h5"}},
			file("hdr/x", 0o644, "before its directory's header\n"),
			dir("hdr/", 0o750, 6, 6).xattr("user.h", "header").xattr("user.both", "header"),
		),
		layerOf(t, comp,
			file(".salt-2", 0o644, salt),
			file("f2d/b", 0o644, "b\n"),
			file("lnk/zz", 0o644, "through a symlink of the layer below\n"),
			file("deep/new/path/file", 0o644, "all new\n"),
			file("d-inh/sub/g", 0o644, "g\n"),
			file("home/user/.cache/x", 0o600, "x\n").owned(1000, 1000),
			file("sticky/in", 0o644, "in a sticky directory\n"),
			// New under a setgid directory of layer 0: sub takes its group
			// (and not its setgid bit, which containerd's chmod drops), so
			// deeper does not.
			file("g/sub/deeper/file", 0o644, "two directories down\n"),
			// Made before the layer names its parent: the group is the one
			// the parent had then (layer 0's setgid s; a new n, root's).
			file("s/new/file", 0o644, "s named after\n"),
			dir("s/", 0o755, 0, 0),
			file("n/b/file", 0o644, "n named after\n"),
			dir("n/", 0o2775, 0, 70),
			file("e/tmp/file", 0o644, "under e/tmp, unnamed\n"),
			hdr{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "e", Linkname: host}},
		),
	}
}

// hostDirUntouched is a directory of the host's holding tmp/, which a
// layer's symbolic link names; the test fails if tmp's mode or owner
// changed by its end.
func hostDirUntouched(t *testing.T) string {
	t.Helper()
	host := t.TempDir()
	tmp := filepath.Join(host, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	before, err := os.Lstat(tmp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		after, err := os.Lstat(tmp)
		if err != nil {
			t.Errorf("the host's %s: %v", tmp, err)
			return
		}
		b, a := before.Sys().(*syscall.Stat_t), after.Sys().(*syscall.Stat_t)
		if after.Mode() != before.Mode() || a.Uid != b.Uid || a.Gid != b.Gid {
			t.Errorf("the host's %s was changed through a layer's symbolic link: %v %d:%d, was %v %d:%d",
				tmp, after.Mode(), a.Uid, a.Gid, before.Mode(), b.Uid, b.Gid)
		}
	})
	return host
}

// minbaseLayers are a Debian minbase root filesystem and a layer that
// writes into its directories without naming them.
func minbaseLayers(t *testing.T, comp compression.Compression, salt, base string) []v1.Layer {
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	// The salt goes first, as an entry of the same stream: the layer is
	// the test's own.
	var salted bytes.Buffer
	tw := tar.NewWriter(&salted)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: ".salt", Mode: 0o644, Size: int64(len(salt)), ModTime: time.Unix(0, 0)})
	io.WriteString(tw, salt)
	tw.Flush() // no end of archive: the base's entries follow
	salted.Write(b)
	return []v1.Layer{
		rawLayer(t, comp, salted.Bytes()),
		layerOf(t, comp,
			file(".salt-1", 0o644, salt),
			file("tmp/engine.sock.lock", 0o644, "x\n"),
			file("root/.cache/pip/x", 0o600, "x\n"),
			file("var/log/engine.log", 0o640, "log\n"),
			file("var/cache/apt/archives/partial/x", 0o644, "x\n"),
			file("usr/local/bin/engine", 0o755, "#!/bin/sh\n"),
			file("etc/ssl/certs/extra.pem", 0o644, "pem\n"),
			file("home/engine/.bashrc", 0o644, "x\n").owned(1000, 1000),
		),
	}
}
