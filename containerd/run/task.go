package run

import (
	"bytes"
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// taskEnd is how waiting for a task ended.
type taskEnd struct {
	code      int
	timedOut  bool  // killed at its timeout
	cancelled bool  // the caller gave up; killed
	lost      error // containerd lost its exit status; killed
}

// awaitTask waits for a started task's exit, its timeout, or ctx, and
// kills it in the last two cases. A task whose exit containerd lost (it
// restarted, or went away) may still run in its shim: it is killed too, so
// nothing runs unwatched. A timeout is the answer whether or not the kill's
// exit status came back.
func awaitTask(ctx context.Context, task client.Task, exitCh <-chan client.ExitStatus, timeout time.Duration) taskEnd {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	var end taskEnd
	var status client.ExitStatus
	select {
	case status = <-exitCh:
	case <-expired:
		end.timedOut = true
		status = killTask(ctx, task, exitCh)
	case <-ctx.Done():
		killTask(ctx, task, exitCh)
		end.cancelled = true
		return end
	}
	code, _, err := status.Result()
	end.code = int(code)
	if err != nil {
		killLost(ctx, task)
		if !end.timedOut {
			end.lost = err
		}
	}
	return end
}

// killTask kills every process of a task and waits for its exit, within
// 30 s.
func killTask(ctx context.Context, task client.Task, exitCh <-chan client.ExitStatus) client.ExitStatus {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	task.Kill(kctx, syscall.SIGKILL, client.WithKillAll)
	select {
	case s := <-exitCh:
		return s
	case <-kctx.Done():
		return *client.NewExitStatus(137, time.Now(), kctx.Err())
	}
}

// killLost kills a task whose wait broke, retrying while containerd comes
// back; the deferred delete then removes it.
func killLost(ctx context.Context, task client.Task) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for {
		err := task.Kill(kctx, syscall.SIGKILL, client.WithKillAll)
		if err == nil || errdefs.IsNotFound(err) {
			return
		}
		select {
		case <-kctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// drainOutput waits for the task's output to be copied, but not forever:
// a process that outlived its wait (see killLost) may hold the FIFOs open.
func drainOutput(ctx context.Context, task client.Task) {
	task.CloseIO(context.WithoutCancel(ctx), client.WithStdinCloser)
	ioc := task.IO()
	if ioc == nil {
		return
	}
	done := make(chan struct{})
	go func() { ioc.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		ioc.Cancel()
	}
}

// tailBuffer keeps the last limit bytes written: a verdict line comes
// last, and a probe that floods its output must not flood gpupin's memory.
type tailBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	limit     int
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.limit {
		t.buf.Reset()
		p = p[len(p)-t.limit:]
		t.truncated = true
	}
	t.buf.Write(p)
	if over := t.buf.Len() - t.limit; over > 0 {
		t.buf.Next(over)
		t.truncated = true
		// Compact so the buffer does not grow without end.
		b := append([]byte(nil), t.buf.Bytes()...)
		t.buf.Reset()
		t.buf.Write(b)
	}
	return n, nil
}

func (t *tailBuffer) bytes() ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf.Bytes()...), t.truncated
}
