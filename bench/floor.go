package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"
)

// The physical limit of a pull on this machine, measured in the same run:
// the same layer blobs, decompressed with the fastest tool installed (the
// one containerd 2.x itself picks: igzip, else unpigz, else gzip; zstd for
// zstd) and extracted with tar onto the filesystem containerd's root is on,
// layers in parallel up to the number of CPUs, largest first, until the
// files are on disk (syncfs: a pin waits for that too). No fetch, no
// hashing, no snapshotter: nothing a pull could skip.
//
// On these VMs the same floor run measured 3.0 s and 8.1 s minutes apart
// (the host's memory and disk, not the guest's work), so a floor measured
// apart from the runs it is compared with says little. With the real
// section, each round runs the floor just before gpupin's provision of
// the same image, and the ratio is the median of the rounds' ratios.

// realResult is what realRows measured, for the floor's ratios.
type realResult struct {
	daemon, reg string
	gzip, zstd  time.Duration // gpupin, medians
	// rounds are each round's gpupin and floor, per format (gzip, zstd),
	// when the floor section runs.
	rounds [2][]floorPair
}

type floorPair struct {
	gpupin, floor, extracted time.Duration
}

func syncFS() { syscall.Sync() }

// gzipTool is the decompressor containerd 2.x would run for gzip.
func gzipTool() string {
	for _, t := range []string{"igzip", "unpigz", "gzip"} {
		if p, err := exec.LookPath(t); err == nil {
			return p
		}
	}
	return ""
}

// floorInput is a format's blobs and decompressor.
type floorInput struct {
	format string
	tool   string
	blobs  []string
}

func (e *env) floorInput(ctx context.Context, k int) (floorInput, error) {
	format := []string{"gzip", "zstd"}[k]
	blobs, err := e.blobsOf(ctx, e.real.byReg["inproc"][k].child)
	if err != nil {
		return floorInput{}, err
	}
	tool := gzipTool()
	if format == "zstd" {
		if tool, err = exec.LookPath("zstd"); err != nil {
			return floorInput{}, fmt.Errorf("floor: zstd is not installed (apt-get install zstd): %w", err)
		}
	}
	if tool == "" {
		return floorInput{}, fmt.Errorf("floor: no gzip decompressor installed")
	}
	return floorInput{format: format, tool: tool, blobs: blobs}, nil
}

// floor reports decompress-only and decompress + extract + sync of the
// real-files image's layers, gzip and zstd, with gpupin against them.
func (e *env) floor(ctx context.Context) ([]row, error) {
	pair := e.real.byReg["inproc"]
	var rows []row
	for k, img := range pair {
		in, err := e.floorInput(ctx, k)
		if err != nil {
			return nil, err
		}
		var dec, ext, synced []time.Duration
		for i := 0; i < e.cfg.runs; i++ {
			d, err := floorRun(ctx, in.tool, in.blobs, false)
			if err != nil {
				return nil, err
			}
			dec = append(dec, d)
			logf("floor %s run %d: decompress %s", in.format, i+1, d.Round(time.Millisecond))
		}
		for _, rr := range e.realResults {
			for _, p := range rr.rounds[k] {
				ext, synced = append(ext, p.extracted), append(synced, p.floor)
			}
		}
		paired := len(synced) > 0
		if !paired {
			for i := 0; i < e.cfg.runs; i++ {
				x, s, err := floorRunSync(ctx, in.tool, in.blobs, true)
				if err != nil {
					return nil, err
				}
				ext, synced = append(ext, x), append(synced, s)
				logf("floor %s run %d: decompress + extract %s, + sync %s", in.format, i+1, x.Round(time.Millisecond), s.Round(time.Millisecond))
			}
		}
		r := row{
			name:   fmt.Sprintf("physical limit, real files, %s: decompress + extract the same layers, to disk", in.format),
			gpupin: "", ref: secs(median(synced)),
			notes: fmt.Sprintf("`%s -dc BLOB | tar -x`, then syncfs; %d layers in parallel (at most %d at once, largest first), %.0f MB in, %.2f GB out; %d runs %s to %s; without the sync %s; decompress alone (to /dev/null) %s",
				filepath.Base(in.tool), len(in.blobs), nproc(), float64(img.layerBytes)/1e6, float64(e.real.unpacked)/1e9,
				len(synced), secs(slices.Min(synced)), secs(slices.Max(synced)), secs(median(ext)), secs(median(dec))),
		}
		if paired {
			var ratios []string
			for _, rr := range e.realResults {
				var rs []float64
				for _, p := range rr.rounds[k] {
					rs = append(rs, p.gpupin.Seconds()/p.floor.Seconds())
				}
				if len(rs) == 0 {
					continue
				}
				ratios = append(ratios, fmt.Sprintf("%s, %s: %.2f× (rounds %s)", rr.daemon, rr.reg, medianFloat(rs), fmtRatios(rs)))
			}
			r.gpupin = "—"
			r.ratio = "see notes"
			r.notes += "; gpupin against the floor run just before it, median of the rounds: " + strings.Join(ratios, "; ")
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// medianFloat is median's rule (the upper middle) over ratios.
func medianFloat(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[len(s)/2]
}

func fmtRatios(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(s, "/")
}

// blobsOf lists the layer blobs of child as files in the cache.
func (e *env) blobsOf(ctx context.Context, child string) ([]string, error) {
	ref, err := name.ParseReference(child)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(ref, remote.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range m.Layers {
		p := filepath.Join(e.cfg.cache, "blobs", l.Digest.Algorithm, l.Digest.Hex)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("floor: layer %s is not in the cache: %w", l.Digest, err)
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return fileSize(out[i]) > fileSize(out[j]) })
	return out, nil
}

// floorRun decompresses every blob (and, with extract, untars it into a
// directory of its own), nproc at a time, and times the whole; with
// extract, also until the files are on disk (syncfs), as a pin waits for.
func floorRun(ctx context.Context, tool string, blobs []string, extract bool) (time.Duration, error) {
	d, _, err := floorRunSync(ctx, tool, blobs, extract)
	return d, err
}

func floorRunSync(ctx context.Context, tool string, blobs []string, extract bool) (untilExtracted, untilSynced time.Duration, _ error) {
	dir, err := os.MkdirTemp("/tmp", "gpupin-floor-")
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		os.RemoveAll(dir)
		syncFS()
	}()
	settle()
	sem := make(chan struct{}, nproc())
	errs := make([]error, len(blobs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, b := range blobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			script := fmt.Sprintf("%s -dc %q >/dev/null", tool, b)
			if extract {
				out := filepath.Join(dir, fmt.Sprint(i))
				if err := os.Mkdir(out, 0o755); err != nil {
					errs[i] = err
					return
				}
				script = fmt.Sprintf("%s -dc %q | tar -x -C %q", tool, b, out)
			}
			// bash: dash (Debian's sh) exits on "set -o pipefail", whatever follows it.
			if o, err := exec.CommandContext(ctx, "bash", "-ec", "set -o pipefail; "+script).CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("floor: %s: %w: %s", script, err, o)
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			return 0, 0, err
		}
	}
	if !extract {
		return d, d, nil
	}
	if err := syncDir(dir); err != nil {
		return 0, 0, err
	}
	return d, time.Since(t0), nil
}

// syncDir syncs the filesystem dir is on.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
