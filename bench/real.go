package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/containerd"
	gimages "github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
)

// realImage is one published real-files image: the tag gpupin provisions
// and the child ctr pulls.
type realImage struct {
	ref, child string
	layers     int
	layerBytes int64 // compressed, as served
}

// realImages is the real-files image as published: gzip as built, and
// zstd as `gpupin publish --compression zstd` re-encodes it, on each
// registry.
type realImages struct {
	metas      []realMeta
	unpacked   int64
	files      int
	byReg      map[string][2]realImage // registry → {gzip, zstd}
	encodeTime time.Duration           // gpupin publish --compression zstd
}

// publishReal builds (once) and publishes the real-files image, re-encodes
// it with gpupin's CI command, and copies both to docker-registry.
func (e *env) publishReal(ctx context.Context) (*realImages, error) {
	metas, err := cachedRealLayers(e.cfg.cache)
	if err != nil {
		return nil, err
	}
	ri := &realImages{metas: metas, byReg: map[string][2]realImage{}}
	for _, m := range metas {
		ri.unpacked += m.Unpacked
		ri.files += m.Files
	}
	host := e.reg.Host
	if _, err := sandbox.PublishEngine(ctx, host, "real", "1.0", []sandbox.EngineVariant{
		{Name: "cu13", CUDA: "13.0", Archs: "9.0", Layers: realToLayers(e.cfg.cache, metas)},
	}); err != nil {
		return nil, fmt.Errorf("publish the real-files image: %w", err)
	}
	// The variant re-encoded as CI would: gpupin publish of the variant's
	// alias tag, with --compression zstd.
	t0 := time.Now()
	if _, err := execTimed(e.cfg.gpupin, "publish", "--tag", host+"/real-zstd:1.0", "--engine", "real",
		"--variant", "cu13="+host+"/real:1.0-cu13", "--compression", "zstd"); err != nil {
		return nil, err
	}
	ri.encodeTime = time.Since(t0)
	logf("gpupin publish --compression zstd of the real-files variant: %s", ri.encodeTime.Round(100*time.Millisecond))
	var pair [2]realImage
	for i, repo := range []string{"real", "real-zstd"} {
		if pair[i], err = describeReal(ctx, host+"/"+repo+":1.0"); err != nil {
			return nil, err
		}
	}
	ri.byReg["inproc"] = pair
	if e.dist != nil {
		var dpair [2]realImage
		for i, repo := range []string{"real", "real-zstd"} {
			src, dst := host+"/"+repo+":1.0", e.dist.Host+"/"+repo+":1.0"
			if err := copyIndex(ctx, src, dst); err != nil {
				return nil, err
			}
			if dpair[i], err = describeReal(ctx, dst); err != nil {
				return nil, err
			}
		}
		ri.byReg["distribution"] = dpair
	}
	return ri, nil
}

// copyIndex copies an index, its children and their blobs.
func copyIndex(ctx context.Context, src, dst string) error {
	sref, err := name.ParseReference(src)
	if err != nil {
		return err
	}
	dref, err := name.ParseReference(dst)
	if err != nil {
		return err
	}
	idx, err := remote.Index(sref, remote.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("read %s: %w", src, err)
	}
	if err := remote.WriteIndex(dref, idx, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

func describeReal(ctx context.Context, ref string) (realImage, error) {
	set, err := (&gimages.Resolver{}).Resolve(ctx, ref)
	if err != nil {
		return realImage{}, err
	}
	ri := realImage{ref: ref, child: set.Variants[0].Ref}
	cref, err := name.ParseReference(ri.child)
	if err != nil {
		return realImage{}, err
	}
	img, err := remote.Image(cref, remote.WithContext(ctx))
	if err != nil {
		return realImage{}, fmt.Errorf("read %s: %w", ri.child, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return realImage{}, err
	}
	for _, l := range m.Layers {
		ri.layerBytes += l.Size
		ri.layers++
	}
	return ri, nil
}

// realRows measures the real-files image from one registry: gpupin and
// ctr on the gzip image, then on its zstd re-encoding.
func (e *env) realRows(ctx context.Context, reg string) ([]row, error) {
	pair, ok := e.real.byReg[reg]
	if !ok {
		return nil, nil
	}
	regName := map[string]string{"inproc": "in-process registry", "distribution": "docker-registry"}[reg]
	var out [2]struct {
		g, c []result
	}
	var inputs [2]floorInput
	var rounds [2][]floorPair
	if e.cfg.sections["floor"] {
		for k := range inputs {
			in, err := e.floorInput(ctx, k)
			if err != nil {
				return nil, err
			}
			inputs[k] = in
		}
	}
	for i := 0; i < e.cfg.runs; i++ {
		for k, img := range pair {
			var fp floorPair
			if inputs[k].tool != "" {
				var err error
				if fp.extracted, fp.floor, err = floorRunSync(ctx, inputs[k].tool, inputs[k].blobs, true); err != nil {
					return nil, err
				}
			}
			g, err := e.coldGpupin(ctx, reg, img.ref, img.layerBytes)
			if err != nil {
				return nil, err
			}
			if fp.floor > 0 {
				fp.gpupin = g.dur
				rounds[k] = append(rounds[k], fp)
				logf("floor %s round %d: decompress + extract %s, + sync %s; gpupin %.2f× that", inputs[k].format, i+1,
					fp.extracted.Round(time.Millisecond), fp.floor.Round(time.Millisecond), g.dur.Seconds()/fp.floor.Seconds())
			}
			c, err := e.coldCtr(ctx, reg, img.child, img.layerBytes, i)
			if err != nil {
				return nil, err
			}
			out[k].g, out[k].c = append(out[k].g, g), append(out[k].c, c)
			logf("real %s %s run %d: gpupin %s (RSS %d MiB), ctr %s", []string{"gzip", "zstd"}[k], regName, i+1,
				g.dur.Round(time.Millisecond), g.rssKiB>>10, c.dur.Round(time.Millisecond))
		}
	}
	gz, zs := pair[0], pair[1]
	e.realResults = append(e.realResults, realResult{daemon: "containerd " + e.ctd.Version, reg: regName, gzip: medianOf(out[0].g).dur, zstd: medianOf(out[1].g).dur, rounds: rounds})
	gG, gC := medianOf(out[0].g), medianOf(out[0].c)
	zG, zC := medianOf(out[1].g), medianOf(out[1].c)
	desc := fmt.Sprintf("%d layers, %.0f MB gzip, %.2f GB of %d files unpacked", gz.layers, float64(gz.layerBytes)/1e6, float64(e.real.unpacked)/1e9, e.real.files)
	rows := []row{
		{
			name:   fmt.Sprintf("real files, gzip, cold provision (%s)", regName),
			gpupin: secs(gG.dur), ref: secs(gC.dur) + " (ctr pull + ctr run --rm)", ratio: ratio(gG.dur, gC.dur),
			notes: fmt.Sprintf("%s; %s; %s", desc, spread("gpupin", out[0].g), spread("ctr", out[0].c)),
		},
		{
			name:   fmt.Sprintf("real files, zstd (gpupin publish --compression zstd), cold provision (%s)", regName),
			gpupin: secs(zG.dur), ref: secs(gC.dur) + " (ctr pull + ctr run --rm of the gzip image)", ratio: ratio(zG.dur, gC.dur),
			notes: fmt.Sprintf("%.0f MB zstd; ctr on the zstd image %s (gpupin / that %s); %s", float64(zs.layerBytes)/1e6, secs(zC.dur), ratio(zG.dur, zC.dur), spread("gpupin", out[1].g)),
		},
	}
	if reg == e.cfg.registries[0] {
		rows = append(rows, row{
			name:   "peak RSS during cold provision, real files (gzip; zstd)",
			gpupin: fmt.Sprintf("%d MiB; %d MiB", medianRSS(out[0].g)>>10, medianRSS(out[1].g)>>10),
			ref:    fmt.Sprintf("%d MiB; %d MiB (ctr)", medianRSS(out[0].c)>>10, medianRSS(out[1].c)>>10),
			ratio:  fmt.Sprintf("%.2f", float64(medianRSS(out[0].g))/float64(medianRSS(out[0].c))),
			notes:  "VmHWM of the client process and its children (getrusage); target < 100 MiB at any image size",
		})
	}
	return rows, nil
}

// coldGpupin runs one cold gpupin provision of ref, from an empty namespace.
func (e *env) coldGpupin(ctx context.Context, reg, ref string, layerBytes int64) (result, error) {
	return e.coldGpupinEnv(ctx, nil, reg, ref, layerBytes)
}

func (e *env) coldGpupinEnv(ctx context.Context, env []string, reg, ref string, layerBytes int64) (result, error) {
	const ns = "bench-gpupin"
	if err := e.clean(ctx, ns); err != nil {
		return result{}, err
	}
	e.reg.Reset()
	settle()
	res, err := e.gpupinEnv(env, ns, "provision", "--runc-root", e.ctd.RuncRoot, "--probe-dir", filepath.Join(e.dir, "probe"), ref)
	if err != nil {
		return result{}, err
	}
	if !strings.Contains(res.out, "READY") {
		return result{}, fmt.Errorf("gpupin provision %s not ready:\n%s", ref, tail(res.out))
	}
	if reg == "inproc" {
		if err := e.fetchedAll(layerBytes, "gpupin provision"); err != nil {
			return result{}, err
		}
	}
	return res, e.clean(ctx, ns)
}

// coldCtr runs ctr images pull of child and one ctr run --rm of it, from an
// empty namespace; the result is their sum, with the larger RSS.
func (e *env) coldCtr(ctx context.Context, reg, child string, layerBytes int64, i int) (result, error) {
	const ns = "bench-ctr"
	if err := e.clean(ctx, ns); err != nil {
		return result{}, err
	}
	e.reg.Reset()
	settle()
	pull, err := e.ctr(ns, "images", "pull", "--plain-http", child)
	if err != nil {
		return result{}, err
	}
	runRes, err := e.ctr(ns, "run", "--rm", "--runc-root", e.ctd.RuncRoot, child, fmt.Sprintf("bench-%d", i), "/bin/sh", "-c", `echo 'GPUPIN-PROBE {"ok":true}'`)
	if err != nil {
		return result{}, err
	}
	if reg == "inproc" {
		if err := e.fetchedAll(layerBytes, "ctr images pull"); err != nil {
			return result{}, err
		}
	}
	return result{dur: pull.dur + runRes.dur, rssKiB: max(pull.rssKiB, runRes.rssKiB)}, e.clean(ctx, ns)
}

// settle prepares a timed run: what earlier runs left dirty is written
// back, so a run does not pay for the previous one's writeback; and
// warmMiB of memory is written and freed. On these VMs (Firecracker,
// free pages reported back to the host) writing to a page the guest has
// not touched lately costs several times more than to one it has: the
// same 1.5 GB write into the page cache measured 0.3 s to 4.6 s. Every
// tool measured, and the physical limit, gets the same warming, so none
// pays for the host's reclaim more than another.
func settle() {
	syncFS()
	if warmMiB > 0 {
		if f, err := os.CreateTemp("/dev/shm", "gpupin-bench-warm-"); err == nil {
			buf := make([]byte, 1<<20)
			for i := range buf {
				buf[i] = byte(i)
			}
			for i := 0; i < warmMiB; i++ {
				if _, err := f.Write(buf); err != nil {
					break
				}
			}
			f.Close()
			os.Remove(f.Name())
		}
	}
	time.Sleep(300 * time.Millisecond)
}

var warmMiB = 4096

func medianOf(rs []result) result {
	ds := make([]time.Duration, len(rs))
	for i, r := range rs {
		ds[i] = r.dur
	}
	m := median(ds)
	for _, r := range rs {
		if r.dur == m {
			return r
		}
	}
	return rs[0]
}

func medianRSS(rs []result) int64 {
	v := make([]int64, len(rs))
	for i, r := range rs {
		v[i] = r.rssKiB
	}
	return medianInt(v)
}

// spread lists the runs, so a reader sees the noise behind a median.
func spread(who string, rs []result) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.1f", r.dur.Seconds())
	}
	return who + " runs " + strings.Join(s, "/") + " s"
}

func ratio(a, b time.Duration) string { return fmt.Sprintf("%.2f", a.Seconds()/b.Seconds()) }

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

// lever is one way of pulling, selected by gpupin's environment.
type lever struct {
	name, what string
	env        []string
	zstd       bool   // of the zstd image (else gzip)
	vs         string // the lever it is compared with ("": the first)
}

const leverDefault = "gpupin pipeline, streamed, parallel (the default)"

var leverRows = []lever{
	{name: "containerd's unpacker (gpupin before this change)", what: "client.Pull WithPullUnpack: each layer fetched into the content store, then applied by the daemon, one after another",
		env: []string{containerd.EnvUnpack + "=containerd"}},
	{name: "gpupin pipeline, daemon applies", what: "every layer fetched at once; the daemon's diff service applies each once it is in",
		env: []string{containerd.EnvUnpack + "=daemon"}},
	{name: "gpupin pipeline, streamed, one layer at a time", what: "extracted here while downloading; serial, as on containerd below 2.2 before its layers were moved onto their parents",
		env: []string{containerd.EnvUnpack + "=serial"}},
	{name: leverDefault, what: "extracted here while downloading, layers at once (committed onto the parent by rebase from containerd 2.2, moved onto it below); gzip through igzip; a layer extracted so is not stored"},
	{name: "  the default, keeping layer blobs", what: "GPUPIN_KEEP_LAYERS=1: every blob written to the content store too, as gpupin did before",
		env: []string{"GPUPIN_KEEP_LAYERS=1"}, vs: leverDefault},
	{name: "  the default with unpigz instead of igzip", what: "CONTAINERD_DISABLE_IGZIP=1",
		env: []string{"CONTAINERD_DISABLE_IGZIP=1"}},
	{name: "  the default with Go's gzip", what: "CONTAINERD_DISABLE_IGZIP=1 CONTAINERD_DISABLE_PIGZ=1",
		env: []string{"CONTAINERD_DISABLE_IGZIP=1", "CONTAINERD_DISABLE_PIGZ=1"}},
	{name: "the default, zstd image", what: "the same image re-encoded by gpupin publish --compression zstd", zstd: true, vs: leverDefault},
	{name: "  the default, zstd image, keeping layer blobs", what: "GPUPIN_KEEP_LAYERS=1",
		env: []string{"GPUPIN_KEEP_LAYERS=1"}, zstd: true, vs: "the default, zstd image"},
}

// levers measures the real-files gzip image on the in-process registry
// with each lever, interleaved, against ctr measured in realRows.
func (e *env) levers(ctx context.Context) ([]row, error) {
	imgs := e.real.byReg["inproc"]
	active := []lever{leverRows[0]}
	for _, l := range leverRows[1:] {
		if len(e.cfg.levers) == 0 || slices.ContainsFunc(e.cfg.levers, func(part string) bool { return strings.Contains(l.name, part) }) {
			active = append(active, l)
		}
	}
	runs := make([][]result, len(active))
	for i := 0; i < e.cfg.runs; i++ {
		for k, l := range active {
			img := imgs[0]
			if l.zstd {
				img = imgs[1]
			}
			r, err := e.coldGpupinEnv(ctx, l.env, "inproc", img.ref, img.layerBytes)
			if err != nil {
				return nil, fmt.Errorf("lever %s: %w", l.name, err)
			}
			runs[k] = append(runs[k], r)
			logf("lever %q run %d: %s", l.name, i+1, r.dur.Round(time.Millisecond))
		}
	}
	median := map[string]time.Duration{}
	for k, l := range active {
		median[l.name] = medianOf(runs[k]).dur
	}
	var rows []row
	for k, l := range active {
		m := median[l.name]
		vs, ref := active[0].name, "containerd's unpacker"
		if l.vs != "" {
			vs, ref = l.vs, strings.TrimSpace(l.vs)
		}
		base := median[vs]
		format := "gzip"
		if l.zstd {
			format = "zstd"
		}
		rows = append(rows, row{
			name:   "lever: " + l.name,
			gpupin: secs(m), ref: secs(base) + " (" + ref + ")", ratio: ratio(m, base),
			notes: fmt.Sprintf("real files, %s, in-process registry; %s; %s", format, l.what, spread("gpupin", runs[k])),
		})
	}
	return rows, nil
}
