package pull

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
	"testing"
)

// What a stream is given, its reader gets, in order, then the download's
// outcome; a writer far ahead of its reader waits instead of buffering.
func TestStreamCarriesBytesInOrder(t *testing.T) {
	var pending atomic.Int64
	s := newStream(&pending, true)
	want := bytes.Repeat([]byte("0123456789"), 3<<20/10) // more than streamCap
	go func() {
		for p := want; len(p) > 0; {
			n := min(len(p), 70000)
			s.Write(p[:n])
			s.mu.Lock()
			if s.buffered > streamCap+70000 {
				t.Errorf("buffered %d, over the cap", s.buffered)
			}
			s.mu.Unlock()
			p = p[n:]
		}
		s.finish(nil)
	}()
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, %v; want the %d written", len(got), err, len(want))
	}

	failed := newStream(&pending, true)
	failed.Write([]byte("abc"))
	boom := errors.New("registry went away")
	failed.finish(boom)
	if got, err := io.ReadAll(failed); string(got) != "abc" || !errors.Is(err, boom) {
		t.Fatalf("read %q, %v; want abc then the download's error", got, err)
	}
}

// A stream nobody reads yet keeps what the pull's budget allows, then
// lets go of it: the download goes on into the content store alone.
func TestStreamDetachesBeyondThePendingBudget(t *testing.T) {
	var pending atomic.Int64
	s := newStream(&pending, false)
	chunk := make([]byte, 1<<20)
	for i := 0; i < pendingBudget>>20; i++ {
		s.Write(chunk)
	}
	if s.isDetached() || pending.Load() != pendingBudget {
		t.Fatalf("detached %v, pending %d; want all %d kept", s.isDetached(), pending.Load(), pendingBudget)
	}
	s.Write(chunk)
	if !s.isDetached() || pending.Load() != 0 {
		t.Fatalf("detached %v, pending %d; want detached and the budget back", s.isDetached(), pending.Load())
	}
	if s.attach() {
		t.Fatal("a detached stream was attached")
	}
	if _, err := s.Read(chunk); !errors.Is(err, errDetached) {
		t.Fatalf("read: %v, want errDetached", err)
	}

	// Attached in time, it keeps its bytes and gives the budget back as
	// they are read.
	early := newStream(&pending, false)
	early.Write([]byte("head"))
	if !early.attach() {
		t.Fatal("attach failed")
	}
	early.Write([]byte("tail"))
	early.finish(nil)
	if got, _ := io.ReadAll(early); string(got) != "headtail" || pending.Load() != 0 {
		t.Fatalf("read %q, pending %d", got, pending.Load())
	}
}
