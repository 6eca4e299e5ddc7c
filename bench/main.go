// Command bench measures gpupin against the tools an operator would
// otherwise use (ctr, crane), on the same loopback registry (blobs on disk)
// and the same private containerd, in one run. scripts/bench.sh builds and
// runs it; it prints a Markdown table and writes it to -out.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/gpupin/gpupin/containerd"
	gimages "github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
)

const layersPerImage = 8

// nodeFacts is a simulated H100 on driver 580 (CUDA 13.0): every variant
// the bench publishes fits it.
const nodeFacts = `{"driver":"580.82.07","cuda":"13.0","platform":"linux/amd64","gpus":[{"index":0,"uuid":"GPU-5f6a1c2e-8d3b-4e7a-9c1d-2b3e4f5a6b7c","name":"NVIDIA H100 80GB HBM3","brand":"nvidia","cc":"9.0","memory_mib":81559}]}`

type config struct {
	gpupin, crane, cache, out string
	runs                      int
	sizes                     []int64 // bytes per image
	// containerds are the daemons measured, in order: "" is containerd
	// from PATH (Debian's 1.6), else a directory as GPUPIN_TEST_CONTAINERD
	// takes it (containerd 2.4.2 with its shim and ctr).
	containerds []string
	// registries serve the real-files image: "inproc" (go-containerregistry,
	// blobs on disk, counting what it serves) and "distribution" (Debian's
	// docker-registry, as deployments run it).
	registries []string
	sections   map[string]bool
	// probeTime is how long the failing first candidate's probe takes in
	// the fallback rows (a torch probe imports torch before it can fail).
	probeTime time.Duration
	// levers, when set, are the lever rows measured: each a part of a
	// row's name (the first row, the others' reference, always runs).
	levers []string
	// trustSize is the signed image's size in the trust rows.
	trustSize int64
}

var allSections = []string{"random", "real", "levers", "floor", "fallback", "trust", "warm", "plan", "probe"}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case rusageHelper:
			os.Exit(runRusageHelper(os.Args[2:]))
		case provisionHelper:
			os.Exit(runProvisionHelper(os.Args[2:]))
		}
	}
	var cfg config
	var sizes, ctds, regs, sections, levers string
	flag.StringVar(&cfg.gpupin, "gpupin", "bin/gpupin", "gpupin binary")
	flag.StringVar(&cfg.crane, "crane", "crane", "crane binary")
	flag.StringVar(&cfg.cache, "cache", "/var/tmp/gpupin-bench", "where generated layers are kept between runs (registry blob dir)")
	flag.StringVar(&cfg.out, "out", "bench/results.md", "write the Markdown table here")
	flag.IntVar(&cfg.runs, "runs", 3, "runs per cold measurement (medians are reported)")
	flag.StringVar(&sizes, "sizes", "512,2048", "image sizes in MiB for the random-bytes cold provision rows")
	flag.StringVar(&ctds, "containerd", ",/var/tmp/gpupin-tools/containerd-2.4.2", "comma-separated daemons to measure: empty = containerd from PATH, else a containerd 2.x directory (its own shim and ctr); one that is missing is skipped with a note")
	flag.StringVar(&regs, "registries", "inproc,distribution", "registries serving the real-files image: inproc, distribution (Debian's docker-registry)")
	flag.StringVar(&sections, "sections", strings.Join(allSections, ","), "what to measure: "+strings.Join(allSections, ", "))
	flag.DurationVar(&cfg.probeTime, "probe-time", 8*time.Second, "how long the failing first candidate's probe runs in the fallback rows")
	flag.StringVar(&levers, "levers", "", "comma-separated parts of the lever rows' names to measure (default: every row)")
	var trustMiB int64
	flag.Int64Var(&trustMiB, "trust-mib", 256, "size in MiB of the signed image in the trust rows")
	flag.IntVar(&warmMiB, "warm-mib", 4096, "before each timed run, write and free this much of tmpfs (0: don't); see settle")
	flag.Parse()
	for _, s := range strings.Split(sizes, ",") {
		var mib int64
		if _, err := fmt.Sscan(s, &mib); err != nil || mib < layersPerImage {
			fmt.Fprintf(os.Stderr, "bench: -sizes %q: want MiB values of at least %d\n", sizes, layersPerImage)
			os.Exit(2)
		}
		cfg.sizes = append(cfg.sizes, mib<<20)
	}
	if trustMiB < layersPerImage {
		fmt.Fprintf(os.Stderr, "bench: -trust-mib %d: want at least %d\n", trustMiB, layersPerImage)
		os.Exit(2)
	}
	cfg.trustSize = trustMiB << 20
	cfg.containerds = strings.Split(ctds, ",")
	if levers != "" {
		cfg.levers = strings.Split(levers, ",")
	}
	cfg.registries = strings.Split(regs, ",")
	for _, r := range cfg.registries {
		if r != "inproc" && r != "distribution" {
			fmt.Fprintf(os.Stderr, "bench: -registries: %q is neither inproc nor distribution\n", r)
			os.Exit(2)
		}
	}
	cfg.sections = map[string]bool{}
	for _, s := range strings.Split(sections, ",") {
		if !slices.Contains(allSections, s) {
			fmt.Fprintf(os.Stderr, "bench: -sections: %q is not one of %s\n", s, strings.Join(allSections, ", "))
			os.Exit(2)
		}
		cfg.sections[s] = true
	}
	if err := run(context.Background(), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// env is the shared sandbox every measurement uses; ctd and cl are the
// daemon being measured.
type env struct {
	cfg      config
	ctd      *sandbox.Containerd
	reg      *sandbox.Registry
	dist     *sandbox.Distribution
	cl       *client.Client
	dir      string // scratch: node file, probe dir, overrides path
	nodeFile string
	real     *realImages
	// realResults are the real-files medians so far, for the floor rows.
	realResults []realResult
	// signed is the trust rows' image, once published.
	signed *signedImage
}

type row struct {
	name, gpupin, ref, ratio, notes string
}

// section is a heading row: the rows under it belong to one daemon.
func section(title string) row { return row{name: "**" + title + "**"} }

func run(ctx context.Context, cfg config) error {
	start := time.Now()
	if err := os.MkdirAll(filepath.Join(cfg.cache, "blobs"), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gpupin-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e := &env{cfg: cfg, dir: dir, nodeFile: filepath.Join(dir, "node.json")}
	if err := os.WriteFile(e.nodeFile, []byte(nodeFacts), 0o644); err != nil {
		return err
	}
	// The registry serves blobs from the cache itself: generated layers are
	// there already and need no upload.
	e.reg, err = sandbox.StartRegistry(sandbox.RegistryOptions{BlobDir: filepath.Join(cfg.cache, "blobs")})
	if err != nil {
		return fmt.Errorf("start registry: %w", err)
	}
	defer e.reg.Close()
	if cfg.sections["real"] || cfg.sections["levers"] || cfg.sections["fallback"] || cfg.sections["floor"] {
		if slices.Contains(cfg.registries, "distribution") && cfg.sections["real"] {
			if e.dist, err = sandbox.StartDistribution(ctx, sandbox.DistributionOptions{}); err != nil {
				return fmt.Errorf("start docker-registry: %w", err)
			}
			defer e.dist.Close()
		}
		if e.real, err = e.publishReal(ctx); err != nil {
			return err
		}
	}

	var rows []row
	var versions []string
	var notes []string
	for i, bin := range cfg.containerds {
		if bin != "" {
			if _, err := os.Stat(bin); err != nil {
				notes = append(notes, fmt.Sprintf("containerd %s not measured: %v (scripts/deps.sh builds it)", bin, err))
				continue
			}
		}
		e.ctd, err = sandbox.StartContainerd(ctx, sandbox.ContainerdOptions{Bin: bin})
		if err != nil {
			return fmt.Errorf("start containerd %s: %w", bin, err)
		}
		r, err := e.daemonRows(ctx, i == 0)
		e.ctd.Stop()
		if err != nil {
			return fmt.Errorf("containerd %s: %w", e.ctd.Version, err)
		}
		versions = append(versions, e.ctd.Version)
		rows = append(rows, r...)
	}
	if cfg.sections["floor"] && e.real != nil {
		r, err := e.floor(ctx)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}

	var b strings.Builder
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "gpupin `make bench`, %s; %d CPUs; containerd %s; loopback registries with blobs on disk; medians of %d runs (cold) unless the row says otherwise; load average at the end %s; total %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), nproc(), strings.Join(versions, " and "), cfg.runs,
		strings.Join(strings.Fields(string(load))[:3], " "), time.Since(start).Round(time.Second))
	for _, n := range notes {
		fmt.Fprintf(&b, "Note: %s.\n\n", n)
	}
	b.WriteString("| measurement | gpupin | reference | gpupin / reference | notes |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.name, r.gpupin, r.ref, r.ratio, r.notes)
	}
	fmt.Print("\n" + b.String())
	// The table is the file's head; sections other benchmarks write
	// (## Herd rollout, from make bench-herd) are kept.
	if old, err := os.ReadFile(cfg.out); err == nil {
		if i := strings.Index(string(old), "\n## "); i >= 0 {
			b.WriteString(string(old[i:]))
		}
	}
	if err := os.WriteFile(cfg.out, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", cfg.out, err)
	}
	logf("wrote %s", cfg.out)
	return nil
}

// daemonRows measures one daemon: the real-files rows on every registry,
// the fallback rows, and, for the first daemon, the random-bytes rows and
// the small measurements.
func (e *env) daemonRows(ctx context.Context, first bool) ([]row, error) {
	var err error
	e.cl, err = client.New(e.ctd.Address)
	if err != nil {
		return nil, fmt.Errorf("connect containerd: %w", err)
	}
	defer e.cl.Close()
	logf("sandbox: containerd %s at %s, registry %s, cache %s", e.ctd.Version, e.ctd.Address, e.reg.Host, e.cfg.cache)
	rows := []row{section("containerd " + e.ctd.Version)}
	s := e.cfg.sections
	if s["real"] {
		for _, reg := range e.cfg.registries {
			r, err := e.realRows(ctx, reg)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r...)
		}
	}
	if s["levers"] && e.real != nil {
		r, err := e.levers(ctx)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	if s["fallback"] {
		r, err := e.fallback(ctx)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	if s["trust"] {
		r, err := e.trustRows(ctx)
		if err != nil {
			return nil, fmt.Errorf("trust rows: %w", err)
		}
		rows = append(rows, r...)
	}
	if !first {
		return rows, nil
	}
	if s["random"] {
		for _, size := range e.cfg.sizes {
			r, err := e.cold(ctx, size)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r...)
		}
	}
	for _, sec := range []struct {
		name string
		fn   func(context.Context) ([]row, error)
	}{{"warm", e.warm}, {"plan", e.plan}, {"probe", e.probe}} {
		if !s[sec.name] {
			continue
		}
		r, err := sec.fn(ctx)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// cold measures gpupin provision against ctr pull + ctr run --rm of one
// image of size bytes, each from an empty namespace with its content gone.
func (e *env) cold(ctx context.Context, size int64) ([]row, error) {
	mib := size >> 20
	ref, child, layerBytes, err := e.publishRandom(ctx, size)
	if err != nil {
		return nil, err
	}

	var gTimes, cTimes []time.Duration
	var gRSS, cRSS []int64
	for i := 0; i < e.cfg.runs; i++ {
		// gpupin: resolve the tag, choose, pull by digest, probe, pin.
		if err := e.clean(ctx, "bench-gpupin"); err != nil {
			return nil, err
		}
		e.reg.Reset()
		settle()
		res, err := e.gpupin("bench-gpupin", "provision", "--runc-root", e.ctd.RuncRoot, "--probe-dir", filepath.Join(e.dir, "probe"), ref)
		if err != nil {
			return nil, err
		}
		if err := e.fetchedAll(layerBytes, "gpupin provision"); err != nil {
			return nil, err
		}
		gTimes, gRSS = append(gTimes, res.dur), append(gRSS, res.rssKiB)
		logf("cold %d MiB run %d: gpupin provision %s, peak RSS %d MiB", mib, i+1, res.dur.Round(time.Millisecond), res.rssKiB>>10)
		if err := e.clean(ctx, "bench-gpupin"); err != nil {
			return nil, err
		}

		// ctr: the same child, pulled and unpacked, then one container run.
		if err := e.clean(ctx, "bench-ctr"); err != nil {
			return nil, err
		}
		e.reg.Reset()
		settle()
		pull, err := e.ctr("bench-ctr", "images", "pull", "--plain-http", child)
		if err != nil {
			return nil, err
		}
		runRes, err := e.ctr("bench-ctr", "run", "--rm", "--runc-root", e.ctd.RuncRoot, child, fmt.Sprintf("bench-%d", i), "/bin/sh", "-c", `echo 'GPUPIN-PROBE {"ok":true}'`)
		if err != nil {
			return nil, err
		}
		if err := e.fetchedAll(layerBytes, "ctr images pull"); err != nil {
			return nil, err
		}
		cTimes = append(cTimes, pull.dur+runRes.dur)
		cRSS = append(cRSS, max(pull.rssKiB, runRes.rssKiB))
		logf("cold %d MiB run %d: ctr pull %s + run %s, peak RSS %d MiB", mib, i+1, pull.dur.Round(time.Millisecond), runRes.dur.Round(time.Millisecond), max(pull.rssKiB, runRes.rssKiB)>>10)
		if err := e.clean(ctx, "bench-ctr"); err != nil {
			return nil, err
		}
	}
	g, c := median(gTimes), median(cTimes)
	gr, cr := medianInt(gRSS), medianInt(cRSS)
	return []row{
		{
			name:   fmt.Sprintf("cold provision, %d MiB in %d layers", mib, layersPerImage),
			gpupin: secs(g), ref: secs(c) + " (ctr pull + ctr run --rm)", ratio: fmt.Sprintf("%.2f", g.Seconds()/c.Seconds()),
			notes: fmt.Sprintf("gpupin: resolve tag + choose + pull by digest + unpack + simulated probe + pin; %.0f MB/s vs %.0f MB/s", mbps(layerBytes, g), mbps(layerBytes, c)),
		},
		{
			name:   fmt.Sprintf("peak RSS during cold provision, %d MiB", mib),
			gpupin: fmt.Sprintf("%d MiB", gr>>10), ref: fmt.Sprintf("%d MiB (ctr)", cr>>10), ratio: fmt.Sprintf("%.2f", float64(gr)/float64(cr)),
			notes: "VmHWM of the client process (getrusage); target < 100 MiB at any image size",
		},
	}, nil
}

// publishRandom publishes the random-bytes image of size bytes (layers
// generated once into the cache) and returns its tag, its child and the
// bytes of its layers.
func (e *env) publishRandom(ctx context.Context, size int64) (ref, child string, layerBytes int64, err error) {
	layers, err := cachedLayers(e.cfg.cache, size)
	if err != nil {
		return "", "", 0, err
	}
	engine := fmt.Sprintf("cold%dm", size>>20)
	if _, err := sandbox.PublishEngine(ctx, e.reg.Host, engine, "1.0", []sandbox.EngineVariant{
		{Name: "cu13", CUDA: "13.0", Archs: "9.0", Layers: layers},
	}); err != nil {
		return "", "", 0, fmt.Errorf("publish %s: %w", engine, err)
	}
	ref = fmt.Sprintf("%s/%s:1.0", e.reg.Host, engine)
	set, err := (&gimages.Resolver{}).Resolve(ctx, ref)
	if err != nil {
		return "", "", 0, err
	}
	for _, l := range layers {
		n, _ := l.Size()
		layerBytes += n
	}
	return ref, set.Variants[0].Ref, layerBytes, nil
}

// fetchedAll checks the last command really fetched the image's layers:
// a cold run that found content left over would measure nothing.
func (e *env) fetchedAll(layerBytes int64, what string) error {
	if got := e.reg.BytesServed("blob", "GET"); got < layerBytes {
		return fmt.Errorf("%s fetched %d blob bytes, less than the %d of the layers: the run was not cold", what, got, layerBytes)
	}
	return nil
}

// warm measures a re-provision of what is already pinned on the same node:
// gpupin answers from the pin; ctr pull of a present image still asks.
func (e *env) warm(ctx context.Context) ([]row, error) {
	ref, _, _, err := e.publishRandom(ctx, e.cfg.sizes[0])
	if err != nil {
		return nil, err
	}
	if err := e.clean(ctx, "bench-warm"); err != nil {
		return nil, err
	}
	if _, err := e.gpupin("bench-warm", "provision", "--runc-root", e.ctd.RuncRoot, "--probe-dir", filepath.Join(e.dir, "probe"), ref); err != nil {
		return nil, err
	}
	set, err := (&gimages.Resolver{}).Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	child := set.Variants[0].Ref
	// ctr gets a namespace of its own: its pull rewrites the whole image
	// record, pin labels included.
	if err := e.clean(ctx, "bench-warm-ctr"); err != nil {
		return nil, err
	}
	if _, err := e.ctr("bench-warm-ctr", "images", "pull", "--plain-http", child); err != nil {
		return nil, err
	}
	const n = 5
	var gT, cT []time.Duration
	var gReq, cReq []int64
	for i := 0; i < n; i++ {
		e.reg.Reset()
		res, err := e.gpupin("bench-warm", "provision", "--runc-root", e.ctd.RuncRoot, ref)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(res.out, "READY") {
			return nil, fmt.Errorf("warm re-provision not ready:\n%s", res.out)
		}
		gT, gReq = append(gT, res.dur), append(gReq, int64(len(e.reg.Requests())))
		e.reg.Reset()
		res, err = e.ctr("bench-warm-ctr", "images", "pull", "--plain-http", child)
		if err != nil {
			return nil, err
		}
		cT, cReq = append(cT, res.dur), append(cReq, int64(len(e.reg.Requests())))
	}
	for _, ns := range []string{"bench-warm", "bench-warm-ctr"} {
		if err := e.clean(ctx, ns); err != nil {
			return nil, err
		}
	}
	g, c := median(gT), median(cT)
	return []row{{
		name:   "warm re-provision (pinned, same node)",
		gpupin: fmt.Sprintf("%s, %d requests", ms(g), medianInt(gReq)),
		ref:    fmt.Sprintf("%s, %d requests (ctr pull of the present image)", ms(c), medianInt(cReq)),
		ratio:  fmt.Sprintf("%.2f", g.Seconds()/c.Seconds()),
		notes:  fmt.Sprintf("median of %d; whole process; target 0 requests, < 100 ms", n),
	}}, nil
}

// plan measures gpupin plan of 3 engines × 2 variants against crane
// manifest of the same tags.
func (e *env) plan(ctx context.Context) ([]row, error) {
	var refs []string
	for _, name := range []string{"plan-a", "plan-b", "plan-c"} {
		if _, err := sandbox.PublishEngine(ctx, e.reg.Host, name, "1.0", []sandbox.EngineVariant{
			{Name: "cu13", CUDA: "13.0", Archs: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"},
			{Name: "cu129", CUDA: "12.9", Archs: "7.0,7.5,8.0,8.6,8.9,9.0+PTX"},
		}); err != nil {
			return nil, fmt.Errorf("publish %s: %w", name, err)
		}
		refs = append(refs, fmt.Sprintf("%s/%s:1.0", e.reg.Host, name))
	}
	const rounds = 3
	var gT, cT []time.Duration
	var gReq, cReq []int64
	for i := 0; i < rounds; i++ {
		for _, ref := range refs {
			e.reg.Reset()
			res, err := e.gpupin("", "plan", ref)
			if err != nil {
				return nil, err
			}
			gT, gReq = append(gT, res.dur), append(gReq, int64(len(e.reg.Requests())))
			e.reg.Reset()
			res, err = execTimed(e.cfg.crane, "manifest", ref)
			if err != nil {
				return nil, err
			}
			cT, cReq = append(cT, res.dur), append(cReq, int64(len(e.reg.Requests())))
		}
	}
	g, c := median(gT), median(cT)
	return []row{{
		name:   "plan, per engine (3 engines × 2 variants)",
		gpupin: fmt.Sprintf("%s, %d requests", ms(g), medianInt(gReq)),
		ref:    fmt.Sprintf("%s, %d requests (crane manifest)", ms(c), medianInt(cReq)),
		ratio:  fmt.Sprintf("%.2f", g.Seconds()/c.Seconds()),
		notes:  fmt.Sprintf("median of %d per tool; gpupin also chooses and explains; manifests only", len(gT)),
	}}, nil
}

// probe measures one trivial container run: create, start, wait, delete.
func (e *env) probe(ctx context.Context) ([]row, error) {
	const ns = "bench-probe"
	if err := e.clean(ctx, ns); err != nil {
		return nil, err
	}
	set, err := (&gimages.Resolver{}).Resolve(ctx, e.reg.Host+"/plan-a:1.0")
	if err != nil {
		return nil, err
	}
	img := set.Variants[0].Ref
	if _, err := e.ctr(ns, "images", "pull", "--plain-http", img); err != nil {
		return nil, err
	}
	rt, err := containerd.Connect(ctx, e.ctd.Address, containerd.WithNamespace(ns), containerd.WithRuncRoot(e.ctd.RuncRoot),
		containerd.WithFIFODir(filepath.Join(e.dir, "fifo")))
	if err != nil {
		return nil, err
	}
	defer rt.Close()
	cmd := []string{"/bin/sh", "-c", `echo 'GPUPIN-PROBE {"ok":true}'`}
	const n = 7
	var lib, cli, ref []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		res, err := rt.Run(ctx, containerd.RunSpec{Image: img, Args: cmd, Hardened: true, Role: "probe", Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			return nil, fmt.Errorf("containerd.Run: exit %d: %v: %s", res.ExitCode, err, res.Output)
		}
		lib = append(lib, time.Since(t0))
		r, err := e.gpupin(ns, "probe", "--runc-root", e.ctd.RuncRoot, "--probe-dir", filepath.Join(e.dir, "probe"), img)
		if err != nil {
			return nil, err
		}
		cli = append(cli, r.dur)
		r, err = e.ctr(ns, append([]string{"run", "--rm", "--runc-root", e.ctd.RuncRoot, img, fmt.Sprintf("probe-%d", i)}, cmd...)...)
		if err != nil {
			return nil, err
		}
		ref = append(ref, r.dur)
	}
	if err := e.clean(ctx, ns); err != nil {
		return nil, err
	}
	l, c, r := median(lib), median(cli), median(ref)
	return []row{
		{
			name: "probe overhead: containerd.Run (in process)", gpupin: ms(l), ref: ms(r) + " (ctr run --rm)", ratio: fmt.Sprintf("%.2f", l.Seconds()/r.Seconds()),
			notes: fmt.Sprintf("median of %d; create + start + wait + delete of `sh -c echo`, hardened box", n),
		},
		{
			name: "probe overhead: `gpupin probe` (process)", gpupin: ms(c), ref: ms(r) + " (ctr run --rm)", ratio: fmt.Sprintf("%.2f", c.Seconds()/r.Seconds()),
			notes: fmt.Sprintf("median of %d; runs the simulated probe script (a few ms of sh) and parses its verdict", n),
		},
	}, nil
}

// clean empties a namespace and waits for containerd's collector, so the
// next run fetches and unpacks everything again.
func (e *env) clean(ctx context.Context, ns string) error {
	ctx = namespaces.WithNamespace(ctx, ns)
	conts, err := e.cl.Containers(ctx)
	if err != nil {
		return fmt.Errorf("clean %s: %w", ns, err)
	}
	for _, c := range conts {
		if t, err := c.Task(ctx, nil); err == nil {
			t.Delete(ctx, client.WithProcessKill)
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil {
			return fmt.Errorf("clean %s: container %s: %w", ns, c.ID(), err)
		}
	}
	ls := e.cl.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		return fmt.Errorf("clean %s: leases: %w", ns, err)
	}
	for _, l := range all {
		ls.Delete(ctx, l)
	}
	is := e.cl.ImageService()
	imgs, err := is.List(ctx)
	if err != nil {
		return fmt.Errorf("clean %s: images: %w", ns, err)
	}
	for i, img := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete()) // the last delete waits for the collector
		}
		if err := is.Delete(ctx, img.Name, opts...); err != nil {
			return fmt.Errorf("clean %s: image %s: %w", ns, img.Name, err)
		}
	}
	if len(imgs) == 0 && len(all) > 0 {
		// Only leases went: make the collector run before checking.
		l, err := ls.Create(ctx, leases.WithRandomID())
		if err == nil {
			ls.Delete(ctx, l, leases.SynchronousDelete)
		}
	}
	var left int64
	if err := e.cl.ContentStore().Walk(ctx, func(i content.Info) error { left += i.Size; return nil }); err != nil {
		return fmt.Errorf("clean %s: walk content: %w", ns, err)
	}
	var snaps int
	e.cl.SnapshotService("overlayfs").Walk(ctx, func(context.Context, snapshots.Info) error { snaps++; return nil })
	if left > 1<<20 || snaps > 0 {
		return fmt.Errorf("clean %s: %d bytes of content and %d snapshots left after gc", ns, left, snaps)
	}
	return nil
}

type result struct {
	dur    time.Duration
	rssKiB int64
	out    string
}

func (e *env) gpupin(ns string, args ...string) (result, error) {
	return e.gpupinEnv(nil, ns, args...)
}

// gpupinEnv runs gpupin with env added to its environment (the levers).
func (e *env) gpupinEnv(env []string, ns string, args ...string) (result, error) {
	global := []string{"--address", e.ctd.Address, "--overrides", filepath.Join(e.dir, "overrides.yaml")}
	if ns != "" {
		global = append(global, "--namespace", ns)
	}
	// --node after the command: the command's own flag shadows the global one.
	all := append(append(global, args[0], "--node", e.nodeFile), args[1:]...)
	return execTimedEnv(env, e.cfg.gpupin, all...)
}

func (e *env) ctr(ns string, args ...string) (result, error) {
	return execTimed(e.ctd.Ctr(), append([]string{"--address", e.ctd.Address, "--namespace", ns}, args...)...)
}

// execTimed times one command to its end and reads its peak RSS. The
// command runs under a small helper (this binary again, rusageHelper): a
// child's ru_maxrss starts from its parent's memory at the fork, and this
// process, which serves the registry, grows to a gigabyte while images
// are pushed into it; the helper is small, so what it reports is the
// command's own (and its children's) high-water mark.
func execTimed(bin string, args ...string) (result, error) {
	return execTimedEnv(nil, bin, args...)
}

func execTimedEnv(env []string, bin string, args ...string) (result, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	ru, err := os.CreateTemp("", "gpupin-bench-rusage-")
	if err != nil {
		return result{}, err
	}
	ru.Close()
	defer os.Remove(ru.Name())
	cmd := exec.Command(self, append([]string{rusageHelper, ru.Name(), bin}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err = cmd.Run()
	res := result{dur: time.Since(t0), out: out.String()}
	var rep struct {
		Nanos  int64 `json:"nanos"`
		MaxKiB int64 `json:"max_kib"`
	}
	if data, rerr := os.ReadFile(ru.Name()); rerr == nil && json.Unmarshal(data, &rep) == nil && rep.Nanos > 0 {
		res.dur, res.rssKiB = time.Duration(rep.Nanos), rep.MaxKiB
	}
	if err != nil {
		return res, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, tail(res.out))
	}
	return res, nil
}

// rusageHelper is the first argument that makes this binary run a command
// and write its time and peak RSS to a file: bench -rusage-exec FILE BIN ARGS...
const rusageHelper = "-rusage-exec"

func runRusageHelper(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "bench: -rusage-exec FILE BIN [ARGS...]")
		return 2
	}
	cmd := exec.Command(args[1], args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	var maxKiB int64
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			maxKiB = ru.Maxrss // KiB on Linux; the command's and its children's
		}
	}
	data, _ := json.Marshal(map[string]int64{"nanos": d.Nanoseconds(), "max_kib": maxKiB})
	os.WriteFile(args[0], data, 0o644)
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

// cachedLayers returns layersPerImage layers of incompressible bytes making
// up size, generating them into the registry's blob directory the first
// time. Seeds are fixed, so the digests are the same from run to run.
func cachedLayers(cache string, size int64) ([]v1.Layer, error) {
	per := size / layersPerImage
	metaPath := filepath.Join(cache, fmt.Sprintf("layers-%d.json", size))
	var metas []layerMeta
	if data, err := os.ReadFile(metaPath); err == nil && json.Unmarshal(data, &metas) == nil && len(metas) == layersPerImage {
		ok := true
		for _, m := range metas {
			if st, err := os.Stat(m.path(cache)); err != nil || st.Size() != m.Size {
				ok = false
			}
		}
		if ok {
			return toLayers(cache, metas), nil
		}
	}
	logf("generating %d layers of %d MiB of random bytes into %s (once; kept for later runs)", layersPerImage, per>>20, cache)
	metas = make([]layerMeta, layersPerImage)
	errs := make([]error, layersPerImage)
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, nproc()))
	for i := range metas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			metas[i], errs[i] = genLayer(cache, uint64(size), uint64(i), per)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	data, _ := json.Marshal(metas)
	if err := os.WriteFile(metaPath, data, 0o644); err != nil {
		return nil, err
	}
	return toLayers(cache, metas), nil
}

type layerMeta struct {
	Digest string `json:"digest"` // sha256:… of the gzip
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
}

func (m layerMeta) path(cache string) string {
	return filepath.Join(cache, "blobs", "sha256", strings.TrimPrefix(m.Digest, "sha256:"))
}

func genLayer(cache string, seed1, seed2 uint64, payload int64) (layerMeta, error) {
	tmp, err := os.CreateTemp(filepath.Join(cache, "blobs"), "gen-*")
	if err != nil {
		return layerMeta{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	dz, du := sha256.New(), sha256.New()
	cnt := &countWriter{}
	gz, _ := gzip.NewWriterLevel(io.MultiWriter(tmp, dz, cnt), gzip.BestSpeed)
	tw := tar.NewWriter(io.MultiWriter(gz, du))
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("payload/%d-%d.bin", seed1, seed2), Mode: 0o644, Size: payload, ModTime: time.Unix(0, 0)}); err != nil {
		return layerMeta{}, err
	}
	rng := rand.NewChaCha8([32]byte{byte(seed1), byte(seed1 >> 8), byte(seed1 >> 16), byte(seed1 >> 24), byte(seed1 >> 32), byte(seed2)})
	buf := make([]byte, 1<<20)
	for left := payload; left > 0; {
		n := min(int64(len(buf)), left)
		rng.Read(buf[:n])
		if _, err := tw.Write(buf[:n]); err != nil {
			return layerMeta{}, err
		}
		left -= n
	}
	if err := tw.Close(); err != nil {
		return layerMeta{}, err
	}
	if err := gz.Close(); err != nil {
		return layerMeta{}, err
	}
	if err := tmp.Close(); err != nil {
		return layerMeta{}, err
	}
	m := layerMeta{Digest: "sha256:" + hexOf(dz), DiffID: "sha256:" + hexOf(du), Size: cnt.n}
	if err := os.MkdirAll(filepath.Dir(m.path(cache)), 0o755); err != nil {
		return layerMeta{}, err
	}
	return m, os.Rename(tmp.Name(), m.path(cache))
}

func hexOf(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// fileLayer is a generated layer: its bytes are already in the registry's
// blob directory, so pushing it is a HEAD that finds it.
type fileLayer struct {
	m     layerMeta
	cache string
}

func toLayers(cache string, metas []layerMeta) []v1.Layer {
	out := make([]v1.Layer, len(metas))
	for i, m := range metas {
		out[i] = fileLayer{m: m, cache: cache}
	}
	return out
}

func (l fileLayer) Digest() (v1.Hash, error)             { return v1.NewHash(l.m.Digest) }
func (l fileLayer) DiffID() (v1.Hash, error)             { return v1.NewHash(l.m.DiffID) }
func (l fileLayer) Size() (int64, error)                 { return l.m.Size, nil }
func (l fileLayer) MediaType() (types.MediaType, error)  { return types.OCILayer, nil }
func (l fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.m.path(l.cache)) }
func (l fileLayer) Uncompressed() (io.ReadCloser, error) { return gunzipFile(l.m.path(l.cache)) }

func gunzipFile(p string) (io.ReadCloser, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func medianInt(v []int64) int64 {
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
func mbps(b int64, d time.Duration) float64 {
	return float64(b) / 1e6 / d.Seconds()
}

func nproc() int {
	n := 0
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "processor") {
			n++
		}
	}
	return n
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
