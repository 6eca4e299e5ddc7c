package registry

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// MaxManifestBytes bounds a manifest or index: metadata is small, and a
// registry that sends more is broken or hostile. containerd's resolver
// would read a tag's manifest whole to digest it, so the bound is here,
// on the wire.
const MaxManifestBytes = 4 << 20

// ErrTooLarge marks a manifest over MaxManifestBytes.
var ErrTooLarge = errors.New("manifest over gpupin's limit")

// ErrStalled marks a request cut because the registry stopped answering:
// no response headers in time, or a body that stopped moving.
var ErrStalled = errors.New("registry stalled")

// boundedTransport bounds what a registry may withhold: headers must come
// within HeaderTimeout (set on the http.Transport beneath), and a body must
// keep moving.
type boundedTransport struct {
	next   http.RoundTripper
	policy *Policy
	// writes, when set, carries the requests that are not GET or HEAD,
	// unbounded (updatePushClient).
	writes http.RoundTripper
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.writes != nil && req.Method != http.MethodGet && req.Method != http.MethodHead {
		return t.writes.RoundTrip(req)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && req.Context().Err() == nil {
			return nil, fmt.Errorf("%s %s: no answer in %s: %w (%v)", req.Method, req.URL.Redacted(), t.policy.cfg.HeaderTimeout, ErrStalled, err)
		}
		return nil, err
	}
	manifest := strings.Contains(req.URL.Path, "/manifests/") && resp.StatusCode < 300
	if manifest && resp.ContentLength > MaxManifestBytes {
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %d bytes, more than gpupin's limit of %d for a manifest: %w", req.Method, req.URL.Redacted(), resp.ContentLength, MaxManifestBytes, ErrTooLarge)
	}
	if req.Method == http.MethodHead || resp.Body == nil || resp.Body == http.NoBody {
		return resp, nil
	}
	resp.Body = newStallBody(resp.Body, req.URL.Redacted(), t.policy.cfg.StallTimeout, t.policy.cfg.StallBytes)
	if manifest {
		resp.Body = &limitedBody{rc: resp.Body, left: MaxManifestBytes, url: req.URL.Redacted()}
	}
	return resp, nil
}

// limitedBody fails a manifest body past MaxManifestBytes, whatever its
// headers said.
type limitedBody struct {
	rc   io.ReadCloser
	left int64
	url  string
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("GET %s: more than gpupin's limit of %d bytes for a manifest: %w", b.url, MaxManifestBytes, ErrTooLarge)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// stallBody cuts a body that moves fewer than min bytes in a window.
type stallBody struct {
	rc     io.ReadCloser
	url    string
	window time.Duration
	min    int64

	mu      sync.Mutex
	moved   int64 // in the current window
	total   int64
	stalled error
	done    bool
	timer   *time.Timer
}

func newStallBody(rc io.ReadCloser, url string, window time.Duration, min int64) *stallBody {
	b := &stallBody{rc: rc, url: url, window: window, min: min}
	b.timer = time.AfterFunc(window, b.check)
	return b
}

func (b *stallBody) check() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	if b.moved < b.min {
		b.stalled = fmt.Errorf("GET %s: stalled: %d bytes in the last %s (%d in all): %w", b.url, b.moved, b.window, b.total, ErrStalled)
		b.done = true
		b.rc.Close() // wakes a Read blocked on the connection
		return
	}
	b.moved = 0
	b.timer.Reset(b.window)
}

func (b *stallBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.moved += int64(n)
	b.total += int64(n)
	if b.stalled != nil {
		return n, b.stalled
	}
	if err == io.EOF {
		b.done = true
		b.timer.Stop()
	}
	return n, err
}

func (b *stallBody) Close() error {
	b.mu.Lock()
	b.done = true
	b.timer.Stop()
	b.mu.Unlock()
	return b.rc.Close()
}
