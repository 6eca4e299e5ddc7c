package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The physical limit of a pull on this machine, measured in the same run:
// the same layer blobs, decompressed with the fastest tool installed (the
// one containerd 2.x itself picks: igzip, else unpigz, else gzip; zstd for
// zstd) and extracted with tar onto the filesystem containerd's root is on,
// layers in parallel up to the number of CPUs, largest first. No fetch, no
// hashing, no snapshotter: nothing a pull could skip.

// realResult is what realRows measured, for the floor's ratios.
type realResult struct {
	daemon, reg string
	gzip, zstd  time.Duration // gpupin
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

// floor measures decompress-only and decompress+extract of the real-files
// image's layers, gzip and zstd.
func (e *env) floor(ctx context.Context) ([]row, error) {
	pair := e.real.byReg["inproc"]
	var rows []row
	for k, img := range pair {
		format := []string{"gzip", "zstd"}[k]
		blobs, err := e.blobsOf(ctx, img.child)
		if err != nil {
			return nil, err
		}
		tool := gzipTool()
		if format == "zstd" {
			if tool, err = exec.LookPath("zstd"); err != nil {
				return nil, fmt.Errorf("floor: zstd is not installed (apt-get install zstd): %w", err)
			}
		}
		if tool == "" {
			return nil, fmt.Errorf("floor: no gzip decompressor installed")
		}
		var dec, ext []time.Duration
		for i := 0; i < e.cfg.runs; i++ {
			d, err := floorRun(ctx, tool, blobs, false)
			if err != nil {
				return nil, err
			}
			x, err := floorRun(ctx, tool, blobs, true)
			if err != nil {
				return nil, err
			}
			dec, ext = append(dec, d), append(ext, x)
			logf("floor %s run %d: decompress %s, decompress + extract %s", format, i+1, d.Round(time.Millisecond), x.Round(time.Millisecond))
		}
		d, x := median(dec), median(ext)
		r := row{
			name:   fmt.Sprintf("physical limit, real files, %s: decompress + extract the same layers", format),
			gpupin: "", ref: secs(x),
			notes: fmt.Sprintf("`%s -dc BLOB | tar -x`, %d layers in parallel (at most %d at once, largest first), %.0f MB in, %.2f GB out; decompress alone (to /dev/null) %s",
				filepath.Base(tool), len(blobs), nproc(), float64(img.layerBytes)/1e6, float64(e.real.unpacked)/1e9, secs(d)),
		}
		var ratios []string
		for _, rr := range e.realResults {
			g := rr.gzip
			if format == "zstd" {
				g = rr.zstd
			}
			ratios = append(ratios, fmt.Sprintf("%s on %s, %s: %s (%.2f×)", secs(g), rr.daemon, rr.reg, "gpupin", g.Seconds()/x.Seconds()))
		}
		if len(ratios) > 0 {
			r.gpupin = "—"
			r.ratio = "see notes"
			r.notes += "; gpupin against it: " + strings.Join(ratios, "; ")
		}
		rows = append(rows, r)
	}
	return rows, nil
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
// directory of its own), nproc at a time, and times the whole.
func floorRun(ctx context.Context, tool string, blobs []string, extract bool) (time.Duration, error) {
	dir, err := os.MkdirTemp("/tmp", "gpupin-floor-")
	if err != nil {
		return 0, err
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
			return 0, err
		}
	}
	return d, nil
}
