package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	gimages "github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// The fallback rows: an engine whose first candidate (cu13, the real-files
// image) fails its probe after probeTime, as a torch probe fails after
// importing torch, and whose second (cu129) is a real-files image of other
// layers. Provisioned through the provision library in a process of its
// own (provisionHelper), with and without provision.WithPrefetch.

// saltedRealLayers are the real-files layers made distinct: each is a
// small gzip member holding one tar entry, followed by the original
// blob's bytes. A gzip stream may hold several members, and the tar entry
// comes before the original's; so each layer costs what the original
// costs to fetch and unpack, with other digests, diff IDs and snapshots.
func saltedRealLayers(cache string, metas []realMeta) ([]v1.Layer, error) {
	metaPath := filepath.Join(cache, realVersion+"-salted.json")
	var out []layerMeta
	if data, err := os.ReadFile(metaPath); err == nil && json.Unmarshal(data, &out) == nil && len(out) == len(metas) {
		ok := true
		for _, m := range out {
			if st, err := os.Stat(m.path(cache)); err != nil || st.Size() != m.Size {
				ok = false
			}
		}
		if ok {
			return toLayers(cache, out), nil
		}
	}
	out = nil
	for i, m := range metas {
		logf("salting the real-files layer %q for the fallback rows (once; kept for later runs)", m.Name)
		lm, err := saltLayer(cache, m.layerMeta, fmt.Sprintf("gpupin bench fallback variant, layer %d\n", i))
		if err != nil {
			return nil, fmt.Errorf("salt layer %s: %w", m.Name, err)
		}
		out = append(out, lm)
	}
	data, _ := json.Marshal(out)
	if err := os.WriteFile(metaPath, data, 0o644); err != nil {
		return nil, err
	}
	return toLayers(cache, out), nil
}

func saltLayer(cache string, m layerMeta, salt string) (layerMeta, error) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: ".gpupin-bench-salt", Mode: 0o644, Size: int64(len(salt)), ModTime: time.Unix(0, 0)}); err != nil {
		return layerMeta{}, err
	}
	io.WriteString(tw, salt)
	tw.Flush() // no end-of-archive blocks: the original tar follows
	saltTar := tb.Bytes()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(saltTar)
	zw.Close()

	src, err := os.Open(m.path(cache))
	if err != nil {
		return layerMeta{}, err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Join(cache, "blobs"), "gen-*")
	if err != nil {
		return layerMeta{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	dz := sha256.New()
	cnt := &countWriter{}
	w := io.MultiWriter(tmp, dz, cnt)
	w.Write(gz.Bytes())
	if _, err := io.Copy(w, src); err != nil {
		return layerMeta{}, err
	}
	// The diff ID: the salt's tar bytes, then the original's.
	du := sha256.New()
	du.Write(saltTar)
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return layerMeta{}, err
	}
	zr, err := gzip.NewReader(bufio.NewReaderSize(src, 1<<20))
	if err != nil {
		return layerMeta{}, err
	}
	if _, err := io.Copy(du, zr); err != nil {
		return layerMeta{}, err
	}
	if err := tmp.Close(); err != nil {
		return layerMeta{}, err
	}
	out := layerMeta{Digest: "sha256:" + hexOf(dz), DiffID: "sha256:" + hexOf(du), Size: cnt.n}
	return out, os.Rename(tmp.Name(), out.path(cache))
}

// publishFallback publishes the fallback engine and returns its tag.
func (e *env) publishFallback(ctx context.Context) (string, error) {
	salted, err := saltedRealLayers(e.cfg.cache, e.real.metas)
	if err != nil {
		return "", err
	}
	fail, _ := json.Marshal([]string{"/bin/sh", "-c", fmt.Sprintf(
		`sleep %.1f; echo 'GPUPIN-PROBE {"ok":false,"devices":[],"detail":"bench: this variant fails its probe"}'; exit 1`, e.cfg.probeTime.Seconds())})
	variants := []struct {
		meta   gimages.Metadata
		env    []string
		layers []v1.Layer
	}{
		{gimages.Metadata{Engine: "fallback", EngineVersion: "1.0", Variant: "cu13", CUDA: "13.0", Archs: "9.0", Probe: "exec", ProbeExec: string(fail)},
			[]string{"CUDA_VERSION=13.0.0"}, realToLayers(e.cfg.cache, e.real.metas)},
		{gimages.Metadata{Engine: "fallback", EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Archs: "9.0", Probe: "cuda"},
			[]string{"CUDA_VERSION=12.9.0", "GPUPIN_SIM_PROBE=emulate"}, salted},
	}
	var entries []sandbox.IndexEntry
	for _, v := range variants {
		img, err := sandbox.Image(sandbox.ImageSpec{Env: v.env, Layers: v.layers, Annotations: v.meta.Annotations(),
			Labels: map[string]string{gimages.AnnotationProbeExec: v.meta.ProbeExec}})
		if err != nil {
			return "", err
		}
		entries = append(entries, sandbox.IndexEntry{Image: img, Annotations: v.meta.Annotations(), Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}})
	}
	ref := e.reg.Host + "/fallback:1.0"
	if _, err := sandbox.PushIndex(ctx, ref, entries); err != nil {
		return "", fmt.Errorf("publish the fallback engine: %w", err)
	}
	return ref, nil
}

// fallback measures the failed-first-candidate provision, without and
// with the prefetch overlap, on the in-process registry.
func (e *env) fallback(ctx context.Context) ([]row, error) {
	if e.real == nil {
		return nil, nil
	}
	ref, err := e.publishFallback(ctx)
	if err != nil {
		return nil, err
	}
	var without, with []result
	for i := 0; i < e.cfg.runs; i++ {
		for _, prefetch := range []bool{false, true} {
			res, err := e.provisionLib(ctx, ref, prefetch)
			if err != nil {
				return nil, err
			}
			if !strings.Contains(res.out, string(provision.Ready)+" cu129") {
				return nil, fmt.Errorf("fallback provision did not end on cu129:\n%s", tail(res.out))
			}
			logf("fallback run %d, prefetch %v: %s", i+1, prefetch, res.dur.Round(time.Millisecond))
			if prefetch {
				with = append(with, res)
			} else {
				without = append(without, res)
			}
		}
	}
	wo, wi := medianOf(without).dur, medianOf(with).dur
	single := time.Duration(0)
	for _, r := range e.realResults {
		if r.daemon == "containerd "+e.ctd.Version && r.reg == "in-process registry" {
			single = r.gzip
		}
	}
	costNote := func(d time.Duration) string {
		if single == 0 {
			return ""
		}
		return fmt.Sprintf("; %s over a cold provision of one real-files image (%s)", secs(d-single), secs(single))
	}
	probe := secs(e.cfg.probeTime)
	return []row{
		{
			name:   "fallback: first candidate fails its probe, second pulled after it",
			gpupin: secs(wo), ref: "", ratio: "",
			notes: fmt.Sprintf("two real-files images of different layers; the failing probe takes %s (as a torch probe imports torch before it fails)%s; %s", probe, costNote(wo), spread("runs", without)),
		},
		{
			name:   "fallback with provision.WithPrefetch: second fetched and unpacked while the first is probed",
			gpupin: secs(wi), ref: secs(wo) + " (without prefetch)", ratio: ratio(wi, wo),
			notes: fmt.Sprintf("opt-in, bounded by the candidate's size and the snapshot disk's free space%s; %s", costNote(wi), spread("runs", with)),
		},
	}, nil
}

// provisionLib runs one cold provision of ref through the provision
// library, in a process of its own (provisionHelper), from an empty
// namespace.
func (e *env) provisionLib(ctx context.Context, ref string, prefetch bool) (result, error) {
	const ns = "bench-fallback"
	if err := e.clean(ctx, ns); err != nil {
		return result{}, err
	}
	settle()
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	var pf int64
	if prefetch {
		pf = 64 << 30
	}
	res, err := execTimed(self, provisionHelper, "-address", e.ctd.Address, "-namespace", ns, "-runc-root", e.ctd.RuncRoot,
		"-node", e.nodeFile, "-probe-dir", filepath.Join(e.dir, "probe"), "-sim-probe", filepath.Join(filepath.Dir(e.cfg.gpupin), "gpupin-sim-probe"),
		"-lock-dir", filepath.Join(e.dir, "locks"), "-prefetch", fmt.Sprint(pf), ref)
	if err != nil {
		return res, err
	}
	return res, e.clean(ctx, ns)
}

// provisionHelper is the first argument that makes this binary provision
// one reference through the library: the CLI has no prefetch option.
const provisionHelper = "-provision-helper"

func runProvisionHelper(args []string) int {
	fs := flag.NewFlagSet("provision-helper", flag.ExitOnError)
	address := fs.String("address", "", "containerd socket")
	ns := fs.String("namespace", "", "namespace")
	runcRoot := fs.String("runc-root", "", "runc root")
	nodeFile := fs.String("node", "", "node facts")
	probeDir := fs.String("probe-dir", "", "probe dir")
	simProbe := fs.String("sim-probe", "", "gpupin-sim-probe")
	lockDir := fs.String("lock-dir", "", "lock dir")
	prefetch := fs.Int64("prefetch", 0, "provision.WithPrefetch bytes (0: off)")
	fs.Parse(args)
	ctx := context.Background()
	facts, err := node.LoadFile(*nodeFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rt, err := containerd.Connect(ctx, *address, containerd.WithNamespace(*ns), containerd.WithRuncRoot(*runcRoot),
		containerd.WithFIFODir(filepath.Join(*probeDir, "fifo")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer rt.Close()
	p, err := provision.New(rt, provision.WithNode(node.Static{Facts: facts}), provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(*lockDir), provision.WithProbeDir(*probeDir), provision.WithSimProbe(*simProbe),
		provision.WithPrefetch(*prefetch))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st := p.Provision(ctx, provision.Want{Ref: fs.Arg(0)})
	fmt.Printf("%s %s %s\n", st.State, st.Variant, st.Detail)
	if st.State != provision.Ready {
		return 1
	}
	return 0
}
