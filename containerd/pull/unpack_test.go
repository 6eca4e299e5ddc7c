package pull_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/build"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/containerd/pull"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

// tarLayer is a layer of the given entries, compressed as comp.
func tarLayer(t *testing.T, comp compression.Compression, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.uid, ModTime: time.Unix(0, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithCompression(comp))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// strategyRuntime connects with unpacking strategy mode: a GPUPIN_UNPACK
// value, or "keep" for the default keeping every layer blob.
func strategyRuntime(t *testing.T, mode string) *containerd.Runtime {
	t.Helper()
	if mode == "keep" {
		return testenv.Runtime(t, containerd.WithKeepLayers(true))
	}
	s, err := containerd.ParseUnpack(mode)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Runtime(t, containerd.WithUnpack(s))
}

// whiteoutLayers are three layers that exercise what an extraction must
// get right: owners and modes, hard and symbolic links, a file deleted by
// a whiteout, a directory made opaque, a file replaced; and a large file,
// so the bytes stream through the download while the extraction runs.
// salt makes the blobs the test's own: content is shared between
// namespaces, and a blob another test left would not be downloaded.
func whiteoutLayers(t *testing.T, comp compression.Compression, salt string) []v1.Layer {
	big := strings.Repeat("0123456789abcdef", 4<<20/16) // 4 MiB
	return []v1.Layer{
		tarLayer(t, comp,
			entry{name: ".salt", body: salt},
			entry{name: "a/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "a/keep", body: "kept\n"},
			entry{name: "a/gone", body: "deleted by layer 2\n"},
			entry{name: "a/over", body: "replaced by layer 3\n"},
			entry{name: "a/owned", body: "x", mode: 0o750, uid: 1234},
			entry{name: "a/hard", typ: tar.TypeLink, link: "a/keep"},
			entry{name: "a/sym", typ: tar.TypeSymlink, link: "keep", mode: 0o777},
			entry{name: "a/dir/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "a/dir/old", body: "hidden by the opaque dir\n"},
			entry{name: "big", body: big},
		),
		tarLayer(t, comp,
			entry{name: "a/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "a/.wh.gone"},
			entry{name: "a/dir/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "a/dir/.wh..wh..opq"},
			entry{name: "a/dir/new", body: "new\n"},
		),
		tarLayer(t, comp,
			entry{name: "a/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "a/over", body: "layer 3\n"},
		),
	}
}

// rootfsScript prints what the layers should have made.
const rootfsScript = `cd /a; ls; echo --; ls dir; echo --; cat keep over; ls -ln owned | cut -c1-10; ls -ln owned | awk '{print $3":"$4}'; ` +
	`ls -i keep hard | awk '{print $1}' | uniq | wc -l; ls -l sym | sed 's/.*-> //'; wc -c < /big`

const rootfsWant = "dir\nhard\nkeep\nover\nowned\nsym\n--\nnew\n--\nkept\nlayer 3\n-rwxr-x---\n1234:1234\n1\nkeep\n4194304\n"

// assertRootfs runs rootfsScript in ref and checks what the layers made.
func assertRootfs(t *testing.T, rt *containerd.Runtime, ref string) {
	t.Helper()
	res, err := rt.Run(context.Background(), containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", rootfsScript}, Role: "probe", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Output)
	}
	if got := string(res.Output); got != rootfsWant {
		t.Errorf("root filesystem:\n%s\nwant:\n%s", got, rootfsWant)
	}
}

// Every way gpupin can unpack (its streamed pipeline, parallel where the
// daemon's snapshotter can rebase and serial where it cannot, the daemon's
// diff service, containerd's own unpacker) makes the same root filesystem
// from gzip and zstd layers, with the diff IDs the config names.
func TestUnpackStrategiesMakeTheSameRootfs(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	for _, comp := range []compression.Compression{compression.GZip, compression.ZStd} {
		img, err := sandbox.Image(sandbox.ImageSpec{Layers: whiteoutLayers(t, comp, t.Name()+time.Now().String())})
		if err != nil {
			t.Fatal(err)
		}
		d, err := sandbox.PushImage(ctx, reg.Host+"/unpack:"+string(comp), img)
		if err != nil {
			t.Fatal(err)
		}
		ref := reg.Host + "/unpack@" + d.String()
		for _, mode := range []string{"", "keep", "serial", "daemon", "containerd"} {
			t.Run(string(comp)+"/"+mode, func(t *testing.T) {
				rt := strategyRuntime(t, mode)
				if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
					t.Fatal(err)
				}
				nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
				// The default extracts layers in parallel (as root, on
				// overlayfs, on every containerd), and then stores none it
				// extracted.
				direct := mode == ""
				rec, err := rt.Client().ImageService().Get(nsctx, ref)
				if err != nil {
					t.Fatal(err)
				}
				cimg := client.NewImageWithPlatform(rt.Client(), rec, platforms.Default())
				if ok, err := cimg.IsUnpacked(nsctx, "overlayfs"); err != nil || !ok {
					t.Fatalf("unpacked = %v, %v", ok, err)
				}
				// Each layer blob that is stored records the diff ID its
				// extraction verified.
				want, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				layers, _ := img.Layers()
				for i, l := range layers {
					ld, _ := l.Digest()
					info, err := rt.Client().ContentStore().Info(nsctx, digest.Digest(ld.String()))
					switch {
					case direct && i > 0 && err == nil:
						// (Layer 0, busybox, may be on the daemon's disk from
						// another test: then it is linked, not downloaded.)
						t.Fatalf("layer %d was extracted here and stored too", i)
					case direct && i > 0:
						continue
					case direct && errdefs.IsNotFound(err):
						continue
					case err != nil:
						t.Fatal(err)
					}
					if got := info.Labels[labels.LabelUncompressed]; got != want.RootFS.DiffIDs[i].String() {
						t.Errorf("layer %d: uncompressed label %q, want %s", i, got, want.RootFS.DiffIDs[i])
					}
				}
				assertRootfs(t, rt, ref)
				ctrtest.AssertNothingLeft(t, rt)
			})
		}
	}
}

// A layer whose blob is corrupt (its bytes are not its digest) fails the
// pull, even though its extraction ran while it downloaded: nothing of it
// is committed.
func TestStreamedLayerIsNotCommittedUnverified(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	layers := whiteoutLayers(t, compression.GZip, t.Name()+time.Now().String())
	img, err := sandbox.Image(sandbox.ImageSpec{Layers: layers})
	if err != nil {
		t.Fatal(err)
	}
	d, err := sandbox.PushImage(ctx, reg.Host+"/corrupt:1", img)
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := layers[0].Digest()
	// The registry serves the layer with its gzip header's OS byte
	// changed: as long, and it decompresses to the right diff ID, but these
	// are not the bytes the manifest names, which only the content store's
	// digest check can tell.
	rc, _ := layers[0].Compressed()
	data, _ := io.ReadAll(rc)
	data[9] ^= 1
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+bad.String()) || r.Method != http.MethodGet {
			return false
		}
		w.Write(data)
		return true
	})
	ref := reg.Host + "/corrupt@" + d.String()
	_, err = rt.Pull(ctx, ref, containerd.PullOptions{})
	if err == nil {
		t.Fatal("a corrupt layer was pulled")
	}
	t.Logf("pull: %v", err)
	nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
	var committed []string
	rt.Client().SnapshotService("overlayfs").Walk(nsctx, func(_ context.Context, info snapshotInfo) error {
		committed = append(committed, info.Name)
		return nil
	})
	// The image's first layer is busybox (sandbox.Image): its snapshot
	// may stand; none above it may.
	cfg, _ := img.ConfigFile()
	for _, name := range committed {
		if name != cfg.RootFS.DiffIDs[0].String() {
			t.Errorf("a snapshot above the corrupt layer exists: %s", name)
		}
	}
	ctrtest.AssertNothingLeft(t, rt)
}

// A variant re-encoded as zstd by gpupin publish pulls and unpacks to the
// same diff IDs, so the same snapshots, as the gzip image it came from.
func TestZstdPublishedVariantUnpacksToTheSameDiffIDs(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=13.0.1"}, Layers: whiteoutLayers(t, compression.GZip, t.Name()+time.Now().String())})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.PushImage(ctx, reg.Host+"/src:cu13", img); err != nil {
		t.Fatal(err)
	}
	res, err := build.Publish(ctx, build.PublishOptions{Tag: reg.Host + "/eng:1.0", Engine: "eng",
		Variants: []build.Variant{{Name: "cu13", Ref: reg.Host + "/src:cu13", Archs: "9.0"}}, Compression: build.CompressionZstd})
	if err != nil {
		t.Fatal(err)
	}
	gz, _ := img.Digest()
	var top []string
	for _, ref := range []string{reg.Host + "/src@" + gz.String(), reg.Host + "/eng@" + res.Entries[0].Digest} {
		t.Run(ref[strings.LastIndex(ref, "/")+1:][:3], func(t *testing.T) {
			rt := testenv.Runtime(t)
			if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
			rec, err := rt.Client().ImageService().Get(nsctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			cimg := client.NewImageWithPlatform(rt.Client(), rec, platforms.Default())
			ids, err := cimg.RootFS(nsctx)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := cimg.IsUnpacked(nsctx, "overlayfs"); err != nil || !ok {
				t.Fatalf("unpacked = %v, %v", ok, err)
			}
			top = append(top, fmt.Sprint(ids))
			out, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", rootfsScript}, Role: "probe", Timeout: 30 * time.Second})
			if err != nil || string(out.Output) != rootfsWant {
				t.Errorf("root filesystem (%v):\n%s\nwant:\n%s", err, out.Output, rootfsWant)
			}
		})
	}
	if len(top) == 2 && top[0] != top[1] {
		t.Errorf("diff IDs: gzip %s, zstd %s", top[0], top[1])
	}
}

// The zstd layers of one pull share the decoders' budget by waiting for
// each other before their downloads start, so none is left to the daemon
// for want of a decoder: before, they raced for it as their first bytes
// came, and the layers that lost (on the bench's real-files image, its
// largest) were applied by the daemon after their whole download.
func TestZstdLayersOfOnePullAreAllExtractedHere(t *testing.T) {
	testenv.RequireRoot(t) // extraction here needs root
	ctx := context.Background()
	reg := testenv.Registry(t)
	salt := t.Name() + time.Now().String()
	var layers []v1.Layer
	for i := range 6 {
		// 16 MiB each, a few KiB compressed: the extractions overlap.
		body := strings.Repeat(fmt.Sprintf("%s layer %d\n", salt, i), 16<<20/(len(salt)+10))
		layers = append(layers, tarLayer(t, compression.ZStd, entry{name: fmt.Sprintf("l%d", i), body: body}))
	}
	ref := ctrtest.PushImage(t, reg, "zstd-many:1", sandbox.ImageSpec{Layers: layers})
	rt := testenv.Runtime(t)
	before := pull.Fallbacks()
	if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := pull.Fallbacks() - before; n != 0 {
		t.Errorf("%d of %d zstd layers were left to the daemon", n, len(layers))
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", "for f in /l?; do head -n1 $f | grep -o 'layer [0-9]*'; done"}, Role: "probe", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Output)
	}
	for i := range layers {
		if want := fmt.Sprintf("layer %d\n", i); !strings.Contains(string(res.Output), want) {
			t.Errorf("the root filesystem lacks layer %d's file:\n%s", i, res.Output)
		}
	}
}

// The daemon's apply of a layer extracted in parallel waits for its
// parent's commit; the commits come once every layer has started. An
// image of more layers than extract at once must not wait on itself
// (it did, from six layers on, each waiting layer holding a slot).
func TestDaemonApplyOfManyLayersCompletes(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	salt := t.Name() + time.Now().String()
	var layers []v1.Layer
	for i := range 9 {
		layers = append(layers, tarLayer(t, compression.GZip, entry{name: fmt.Sprintf("d/l%d", i), body: fmt.Sprintf("%s layer %d\n", salt, i)}))
	}
	ref := ctrtest.PushImage(t, reg, "many-layers:1", sandbox.ImageSpec{Layers: layers})
	rt := testenv.Runtime(t, containerd.WithUnpack(pull.Daemon))
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := rt.Pull(pctx, ref, containerd.PullOptions{}); err != nil {
		t.Fatalf("pull of %d layers by the daemon's apply: %v", len(layers), err)
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", "ls /d | wc -l"}, Role: "probe", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Output)
	}
	if got, want := strings.TrimSpace(string(res.Output)), fmt.Sprint(len(layers)); got != want {
		t.Errorf("/d holds %s files, want %s", got, want)
	}
}

// A zstd layer that finds the decoders' memory budget taken (other pulls
// decoding) is not waited for: its download would stall behind its
// stream until the registry's stall bound cut it. The daemon applies it
// from the content store instead, and the root filesystem is the same.
func TestZstdLayersWithoutDecoderBudgetAreAppliedByTheDaemon(t *testing.T) {
	release := pull.HoldZstdBudget()
	defer release()
	ctx := context.Background()
	reg := testenv.Registry(t)
	for _, mode := range []string{"", "serial"} {
		t.Run("mode="+mode, func(t *testing.T) {
			// Blobs of the mode's own: one already in the content store
			// is applied from there, never extracted here.
			ref := ctrtest.PushImage(t, reg, "budget:1", sandbox.ImageSpec{Layers: whiteoutLayers(t, compression.ZStd, t.Name()+time.Now().String())})
			rt := strategyRuntime(t, mode)
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			before := pull.Fallbacks()
			if _, err := rt.Pull(pctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatalf("pull with the zstd budget taken: %v", err)
			}
			if os.Geteuid() == 0 && pull.Fallbacks() == before {
				t.Error("no layer was left to the daemon, with no zstd decoder free")
			}
			assertRootfs(t, rt, ref)
			ctrtest.AssertNothingLeft(t, rt)
		})
	}
}

// Where layers are extracted here in parallel (as root, on overlayfs, on
// every containerd), a pull stores none of the blobs it extracted: the
// image runs from its snapshots, and the pull's progress counts the bytes
// as they come, though the content store never sees them. WithKeepLayers
// stores every blob.
func TestLayersExtractedHereAreNotStored(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			layer, err := sandbox.RandomLayer(2 << 20)
			if err != nil {
				t.Fatal(err)
			}
			ref := ctrtest.PushImage(t, reg, "direct:1", sandbox.ImageSpec{Layers: []v1.Layer{layer}})
			ld, _ := layer.Digest()
			rc, _ := layer.Compressed()
			blob, _ := io.ReadAll(rc)
			// Served slowly, so the progress is seen half way.
			reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
					return false
				}
				w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
				for b := blob; len(b) > 0; {
					n := min(len(b), 64<<10)
					w.Write(b[:n])
					w.(http.Flusher).Flush()
					b = b[n:]
					time.Sleep(15 * time.Millisecond)
				}
				return true
			})
			defer reg.SetHook(nil)
			rt := testenv.Runtime(t, containerd.WithKeepLayers(keep))
			var mu sync.Mutex
			var midway []containerd.Progress
			_, err = rt.Pull(ctx, ref, containerd.PullOptions{Progress: func(p containerd.Progress) {
				if p.Done > 0 && p.Done < p.Total {
					mu.Lock()
					midway = append(midway, p)
					mu.Unlock()
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			if len(midway) == 0 {
				t.Error("no progress was reported while the layer downloaded")
			}
			mu.Unlock()
			nsctx := namespaces.WithNamespace(ctx, rt.Namespace())
			_, err = rt.Client().ContentStore().Info(nsctx, digest.Digest(ld.String()))
			direct := !keep
			t.Logf("keep %v: the layer's blob in the store: %v", keep, err == nil)
			switch {
			case direct && err == nil:
				t.Error("the layer was extracted here and stored too")
			case direct && !errdefs.IsNotFound(err):
				t.Fatal(err)
			case !direct && err != nil:
				t.Errorf("the layer is not in the store: %v", err)
			}
			// What the blobs are kept for: an export (ctr images export)
			// needs them.
			err = rt.Client().Export(nsctx, io.Discard, archive.WithImage(rt.Client().ImageService(), ref))
			t.Logf("export: %v", err)
			if direct == (err == nil) {
				t.Errorf("export with the layer stored %v: %v", !direct, err)
			}
			res, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Args: []string{"/bin/sh", "-c", "cat /payload/*.bin | wc -c"}, Role: "probe", Timeout: 30 * time.Second})
			if err != nil || strings.TrimSpace(string(res.Output)) != fmt.Sprint(2<<20) {
				t.Fatalf("run: %v: %q", err, res.Output)
			}
			ctrtest.AssertNothingLeft(t, rt)
		})
	}
}

// A pull onto layers the node has already (another image's, sharing its
// base) extracts only the new ones. Below containerd 2.2 each new layer is
// moved onto its parent, and only those: a layer found in place is not
// touched (no snapshot to move, no daemon apply).
func TestPullOntoLayersAlreadyThere(t *testing.T) {
	testenv.RequireRoot(t) // extraction here needs root
	ctx := context.Background()
	reg := testenv.Registry(t)
	salt := t.Name() + time.Now().String()
	a := tarLayer(t, compression.GZip, entry{name: "a", body: salt + " a\n"})
	b := tarLayer(t, compression.GZip, entry{name: "b", body: salt + " b\n"})
	c := tarLayer(t, compression.GZip, entry{name: "c", body: salt + " c\n"})
	first := ctrtest.PushImage(t, reg, "shared:first", sandbox.ImageSpec{Layers: []v1.Layer{a}})
	second := ctrtest.PushImage(t, reg, "shared:second", sandbox.ImageSpec{Layers: []v1.Layer{a, b, c}})
	rt := testenv.Runtime(t)
	ls, err := rt.LayerStorage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Pull(ctx, first, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	moved, fell := pull.Moves(), pull.Fallbacks()
	if _, err := rt.Pull(ctx, second, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	if strings.Contains(ls.Unpack, "moved onto the parent") {
		want = 2 // b and c; a (and the base) were there
	}
	if got := pull.Moves() - moved; got != want {
		t.Errorf("%s: %d layers moved onto their parents, want %d", ls.Unpack, got, want)
	}
	if n := pull.Fallbacks() - fell; n != 0 {
		t.Errorf("%d layers left to the daemon", n)
	}
	res, err := rt.Run(ctx, containerd.RunSpec{Image: second, Args: []string{"/bin/sh", "-c", "cat /a /b /c"}, Role: "probe", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, res.Output)
	}
	if want := salt + " a\n" + salt + " b\n" + salt + " c\n"; string(res.Output) != want {
		t.Errorf("root filesystem: %q, want %q", res.Output, want)
	}
}
