package pull

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// A layer stream carries a layer's bytes, as they are downloaded, to the
// extraction of that layer, so that decompressing and writing files
// overlap the download instead of following it. Where the layer is kept,
// the download writes every byte to containerd's content store regardless
// and the stream is a second, bounded consumer beside it; where it is not
// (direct.go), the stream is all the download writes to. Either way it may
// be dropped at any time (detach), after which the layer is applied from
// the content store once it is there. Nothing read from a stream is
// trusted before the blob's digest was verified (by the content store, or
// by the direct download) and the extraction's diff ID: until both were,
// the snapshot is not committed.

// errDetached is what a stream's reader gets once the stream was dropped.
var errDetached = errors.New("layer stream detached")

// streamCap bounds what one attached stream buffers: the download waits
// (backpressure) when its extraction is this far behind.
const streamCap = 2 << 20

// pendingBudget bounds, across one pull, what streams whose extraction has
// not begun may buffer (the next layers, while the one before them is
// applied one at a time); beyond it they are detached and applied from the
// content store later. It keeps a client's memory flat at any image size.
const pendingBudget = 8 << 20

type stream struct {
	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*block // queued bytes, oldest first
	buffered int
	attached bool
	detached bool
	closed   bool
	err      error
	// pending is the budget shared by the pull's unattached streams, and
	// charged what this one holds against it.
	pending *atomic.Int64
	charged int
}

// block is a pooled buffer: a download's gigabytes pass through streams,
// and a fresh copy of each read would be garbage that grows the heap.
type block struct {
	b []byte // filled part
	r int    // read so far
}

const blockSize = 64 << 10

var blockPool = sync.Pool{New: func() any { return &block{b: make([]byte, 0, blockSize)} }}

func newStream(pending *atomic.Int64, attached bool) *stream {
	s := &stream{pending: pending, attached: attached}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Write queues a copy of p for the reader. It never fails: a stream that
// cannot keep the bytes detaches and drops them.
func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.detached || s.closed {
			return len(p), nil
		}
		if !s.attached {
			if s.pending == nil || s.pending.Add(int64(len(p))) > pendingBudget {
				if s.pending != nil {
					s.pending.Add(-int64(len(p)))
				}
				s.detachLocked()
				return len(p), nil
			}
			s.charged += len(p)
			s.push(p)
			return len(p), nil
		}
		if s.buffered == 0 || s.buffered+len(p) <= streamCap {
			s.push(p)
			return len(p), nil
		}
		s.cond.Wait()
	}
}

func (s *stream) push(p []byte) {
	s.buffered += len(p)
	for len(p) > 0 {
		var last *block
		if n := len(s.queue); n > 0 && len(s.queue[n-1].b) < cap(s.queue[n-1].b) {
			last = s.queue[n-1]
		} else {
			last = blockPool.Get().(*block)
			last.b, last.r = last.b[:0], 0
			s.queue = append(s.queue, last)
		}
		n := copy(last.b[len(last.b):cap(last.b)], p)
		last.b = last.b[:len(last.b)+n]
		p = p[n:]
	}
	s.cond.Broadcast()
}

// Read returns what was downloaded so far, waiting for more; io.EOF once
// the download finished, its error if it failed, errDetached if dropped.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.buffered == 0 && !s.closed && !s.detached {
		s.cond.Wait()
	}
	if s.detached {
		return 0, errDetached
	}
	if s.buffered == 0 {
		if s.err != nil {
			return 0, s.err
		}
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && len(s.queue) > 0 {
		b := s.queue[0]
		c := copy(p[n:], b.b[b.r:])
		b.r += c
		n += c
		if b.r < len(b.b) {
			break
		}
		if len(b.b) < cap(b.b) {
			// The writer is still filling it: it stays.
			break
		}
		s.queue[0] = nil
		s.queue = s.queue[1:]
		blockPool.Put(b)
	}
	s.buffered -= n
	if s.charged > 0 {
		c := min(n, s.charged)
		s.charged -= c
		s.pending.Add(-int64(c))
	}
	s.cond.Broadcast()
	return n, nil
}

// attach marks the extraction as reading; false when the stream was
// already dropped (the layer is then applied from the content store).
func (s *stream) attach() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.detached {
		return false
	}
	s.attached = true
	return true
}

// isDetached says whether the stream was dropped.
func (s *stream) isDetached() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.detached
}

// detach drops the stream: the reader gets errDetached, and the download
// goes on into the content store alone (a direct one stops, and starts
// again into the store: direct.go).
func (s *stream) detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detachLocked()
}

func (s *stream) detachLocked() {
	if s.detached {
		return
	}
	s.detached = true
	for _, b := range s.queue {
		blockPool.Put(b)
	}
	s.queue, s.buffered = nil, 0
	if s.charged > 0 {
		s.pending.Add(-int64(s.charged))
		s.charged = 0
	}
	s.cond.Broadcast()
}

// finish ends the stream: the reader drains what is queued, then gets err
// (nil: io.EOF).
func (s *stream) finish(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed, s.err = true, err
	s.cond.Broadcast()
}

// teeBody copies what the download reads into a stream.
type teeBody struct {
	r io.Reader
	s *stream
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.s.Write(p[:n])
	}
	return n, err
}

// teeSeekBody is a teeBody over a seekable body: content.Copy seeks to
// resume, and a resumed read is no longer the stream's next bytes, so the
// stream is dropped first.
type teeSeekBody struct {
	teeBody
	sk io.Seeker
}

func (t *teeSeekBody) Seek(off int64, whence int) (int64, error) {
	t.s.detach()
	return t.sk.Seek(off, whence)
}

func newTee(r io.Reader, s *stream) io.Reader {
	if sk, ok := r.(io.Seeker); ok {
		return &teeSeekBody{teeBody{r, s}, sk}
	}
	return &teeBody{r, s}
}
