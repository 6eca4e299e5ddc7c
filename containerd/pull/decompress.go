package pull

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"
)

// decompress reads the layer's encoding from its first bytes and runs
// the decompressor the puller chose (FindDecompressors): gzip through
// gzipCmd ("" for Go's decoder), zstd in Go. slot is the layer's claim on
// its pull's zstd decoders (nil: none was taken).
func decompress(ctx context.Context, r io.Reader, slot *zstdSlot, gzipCmd string) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic, err := br.Peek(10)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	switch compression.DetectCompression(magic) {
	case compression.Gzip:
		if gzipCmd != "" {
			return cmdStream(exec.Command(gzipCmd, "-d", "-c"), br)
		}
		return gzip.NewReader(br)
	case compression.Zstd:
		// In this process: Go's decoder, at about 600 MB/s a core, costs
		// less here than a zstd command's pipes. A decoder holds its
		// frame's window (2 MiB as gpupin publish writes them, 8 MiB at
		// zstd's usual levels): a budget of windows bounds what decoders
		// this process runs at once, so a client stays small at any layer
		// count. The layers of one pull wait for each other (zstdSlot,
		// before their downloads start); a layer that finds the budget
		// taken by other pulls, or whose window is larger than the whole
		// budget, is not waited for (its download would stall behind the
		// stream) but left to the daemon, which applies it from the
		// content store.
		w := int64(zstdMaxWindow)
		if hdr, _ := br.Peek(32); len(hdr) > 0 {
			var h zstd.Header
			if h.Decode(hdr) == nil && !h.SingleSegment {
				if h.WindowSize > zstdWindowBudget {
					return nil, fmt.Errorf("%w: a zstd window of %d bytes", errNoDecoder, h.WindowSize)
				}
				w = max(int64(h.WindowSize), zstdMinCharge)
			}
		}
		// The claim becomes the window: the pull's next layer need not
		// wait for what this one does not use, and a larger window must
		// not take what the pull's other layers were promised.
		if !slot.resize(w) {
			return nil, fmt.Errorf("%w: a zstd window of %d bytes, and the pull's other layers decoding", errNoDecoder, w)
		}
		if !zstdSem.TryAcquire(w) {
			return nil, fmt.Errorf("%w: the zstd decoders' memory budget is in use", errNoDecoder)
		}
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(zstdWindowBudget))
		if err != nil {
			zstdSem.Release(w)
			return nil, err
		}
		return &zstdReader{Decoder: zr, weight: w}, nil
	}
	return io.NopCloser(br), nil
}

// errNoDecoder is a layer this process does not decompress itself.
var errNoDecoder = errors.New("no decoder here")

const (
	// zstdWindowBudget is the sum of the windows of the zstd decoders
	// running at once in this process, each counted as at least
	// zstdMinCharge: four of gpupin's 2 MiB windows (all the layers one
	// pull extracts at once), or two of zstd's usual 8 MiB; other layers
	// go to the daemon.
	zstdWindowBudget = 16 << 20
	zstdMinCharge    = 4 << 20
	// zstdMaxWindow is what a zstd layer's claim holds before its first
	// bytes tell its window: zstd's largest at its usual levels.
	zstdMaxWindow = 8 << 20
)

var zstdSem = semaphore.NewWeighted(zstdWindowBudget)

// zstdSlot is a zstd layer's claim on its pull's share of the decoders'
// budget, taken before its download starts. Without it the layers of one
// pull raced for the budget as their first bytes came, and the largest
// layer, the one whose extraction most needs to overlap its download,
// could lose and be left to the daemon after its whole download (on the
// bench's real-files image: 7.0 s instead of 5.0).
type zstdSlot struct {
	sem  *semaphore.Weighted
	held int64
}

// claimZstd waits for a zstd layer's claim on sem (a pull's share).
func claimZstd(ctx context.Context, sem *semaphore.Weighted) (*zstdSlot, error) {
	if err := sem.Acquire(ctx, zstdMaxWindow); err != nil {
		return nil, err
	}
	return &zstdSlot{sem: sem, held: zstdMaxWindow}, nil
}

// resize makes the claim to bytes: it gives back what the layer's window
// does not need, or takes more of the pull's share if it is free.
func (s *zstdSlot) resize(to int64) bool {
	switch {
	case s == nil || to == s.held:
	case to < s.held:
		s.sem.Release(s.held - to)
		s.held = to
	case !s.sem.TryAcquire(to - s.held):
		return false
	default:
		s.held = to
	}
	return true
}

// release ends the claim.
func (s *zstdSlot) release() {
	if s != nil && s.held > 0 {
		s.sem.Release(s.held)
		s.held = 0
	}
}

type zstdReader struct {
	*zstd.Decoder
	weight int64
	once   sync.Once
}

func (z *zstdReader) Close() error {
	z.once.Do(func() {
		z.Decoder.Close()
		zstdSem.Release(z.weight)
	})
	return nil
}

// Decompressors names the commands gpupin decompresses layers with ("" for
// Go's decoder), for gpupin detect.
type Decompressors struct {
	Gzip string `json:"gzip"`
}

// DecompressOptions turn off the gzip commands a pull would run, as
// containerd's CONTAINERD_DISABLE_IGZIP and CONTAINERD_DISABLE_PIGZ turn
// off its own: the caller's choice (the CLI reads those variables,
// EnvDisableIgzip and EnvDisablePigz); the package reads no environment.
type DecompressOptions struct {
	NoIgzip bool
	NoPigz  bool
}

// The variables the CLI reads DecompressOptions from: containerd's own.
const (
	EnvDisableIgzip = "CONTAINERD_DISABLE_IGZIP"
	EnvDisablePigz  = "CONTAINERD_DISABLE_PIGZ"
)

// FindDecompressors looks up the fastest gzip decompressor installed that
// o allows, as containerd's own choice goes: igzip, else unpigz, else Go's
// decoder (igzip decodes gzip about four times as fast as Go, unpigz one
// and a half).
func FindDecompressors(o DecompressOptions) Decompressors {
	for _, c := range []struct {
		cmd string
		off bool
	}{{"igzip", o.NoIgzip}, {"unpigz", o.NoPigz}} {
		if c.off {
			continue
		}
		if p, err := exec.LookPath(c.cmd); err == nil {
			return Decompressors{Gzip: p}
		}
	}
	return Decompressors{}
}

// WithDecompress sets which gzip commands pulls may run (default: any
// installed, FindDecompressors). They are looked up once, by New.
func WithDecompress(o DecompressOptions) Option { return func(r *Puller) { r.decompress = o } }

// pipeSize is what cmdStream asks of its pipes: fewer, larger reads and
// writes than the 64 KiB default, for gigabytes of layer.
const pipeSize = 1 << 20

// cmdStream runs a decompressor with in as its input. Reading to the end
// means the command exited (its error, if any, is the read's); Close kills
// it if it is still running, without waiting: its input may be a stream
// that only ends once the caller drops it.
func cmdStream(cmd *exec.Cmd, in io.Reader) (io.ReadCloser, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	for _, f := range []any{stdin, stdout} {
		if fd, ok := f.(interface{ Fd() uintptr }); ok {
			unix.FcntlInt(fd.Fd(), unix.F_SETPIPE_SZ, pipeSize) // best effort
		}
	}
	c := &cmdReader{cmd: cmd, stdout: stdout, done: make(chan struct{})}
	go func() {
		buf := make([]byte, 256<<10)
		_, err := io.CopyBuffer(stdin, in, buf)
		if err != nil {
			// Before stdin closes: a cut input that ends on a gzip member
			// boundary would otherwise read as a clean end.
			c.setInErr(err)
			cmd.Process.Kill()
		}
		stdin.Close()
	}()
	return c, nil
}

type cmdReader struct {
	cmd    *exec.Cmd
	stdout io.ReadCloser
	done   chan struct{}

	mu     sync.Mutex
	inErr  error
	waited bool
	err    error
}

func (c *cmdReader) setInErr(err error) {
	c.mu.Lock()
	c.inErr = err
	c.mu.Unlock()
}

func (c *cmdReader) Read(p []byte) (int, error) {
	n, err := c.stdout.Read(p)
	if err == io.EOF {
		// The command's outcome decides: a truncated or corrupt input is
		// an error, not the end.
		if werr := c.wait(); werr != nil {
			return n, werr
		}
	}
	return n, err
}

func (c *cmdReader) wait() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.waited {
		c.waited = true
		if err := c.cmd.Wait(); err != nil {
			c.err = fmt.Errorf("%s: %w: %s", c.cmd.Path, err, strings.TrimSpace(c.cmd.Stderr.(*bytes.Buffer).String()))
		}
		if c.inErr != nil {
			c.err = c.inErr
		}
	}
	return c.err
}

func (c *cmdReader) Close() error {
	c.mu.Lock()
	waited := c.waited
	c.mu.Unlock()
	if !waited {
		c.cmd.Process.Kill()
		go c.wait() // reaps it once its input lets go
	}
	return nil
}
