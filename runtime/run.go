package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// Mount is a read-only bind mount into a container.
type Mount struct {
	Source      string
	Destination string
}

// RunSpec is one container run to completion.
type RunSpec struct {
	Image string // image record name
	Args  []string
	Env   []string
	// Mounts are bind-mounted read-only.
	Mounts []Mount
	GPUs   GPUs
	// Hardened is the probe's box: no network but lo, read-only root, no
	// new privileges, no capabilities, the default seccomp profile, a
	// writable /tmp only.
	Hardened bool
	// HostNetwork shares the node's network (replicas that serve).
	HostNetwork bool
	// Seccomp is the syscall filter: SeccompDefault (containerd's default
	// profile, Docker's: an allowlist that refuses keyctl, and unshare,
	// setns and mount to a process without CAP_SYS_ADMIN, among others) or
	// SeccompUnconfined (no filter). The hardened box always has the
	// default profile.
	Seccomp     Seccomp
	MemoryLimit uint64 // bytes; 0 = none
	// MemorySwap bounds memory plus swap, in bytes, when MemoryLimit is
	// set: 0 means equal to MemoryLimit (no swap: a limit that swap can
	// stretch without end bounds nothing), -1 unlimited swap.
	MemorySwap int64
	PidsLimit  int64 // 0 = none
	Timeout    time.Duration
	// OutputLimit caps what is kept of stdout+stderr (the tail); default 256 KiB.
	OutputLimit int
	// Stdout, Stderr also receive the output as it comes (gpupin run).
	Stdout, Stderr io.Writer
	Role           string // probe or replica, a label
	Labels         map[string]string
	// ID names the container; default role-random.
	ID string
}

// RunResult is how a run ended.
type RunResult struct {
	ID        string
	ExitCode  int
	Output    []byte // the tail of stdout and stderr, interleaved
	Truncated bool
	Duration  time.Duration
	TimedOut  bool
}

// Seccomp names a container's syscall filter.
type Seccomp string

const (
	// SeccompDefault is containerd's default profile, fitted to the
	// container's capabilities ("" means it too).
	SeccompDefault Seccomp = "default"
	// SeccompUnconfined is no filter at all.
	SeccompUnconfined Seccomp = "unconfined"
)

// ParseSeccomp reads a --seccomp value.
func ParseSeccomp(s string) (Seccomp, error) {
	switch Seccomp(s) {
	case "", SeccompDefault:
		return SeccompDefault, nil
	case SeccompUnconfined:
		return SeccompUnconfined, nil
	}
	return "", fmt.Errorf("seccomp %q: want %s or %s", s, SeccompDefault, SeccompUnconfined)
}

// ErrTimeout marks a run killed at its timeout.
var ErrTimeout = errors.New("timed out")

// Run creates a container from spec.Image, runs it to its end or its
// timeout, and removes it with its task and snapshot whatever happens:
// a probe leaves nothing behind.
func (r *Runtime) Run(ctx context.Context, spec RunSpec) (res RunResult, err error) {
	ctx = r.ctx(ctx)
	seccompMode, err := ParseSeccomp(string(spec.Seccomp))
	if err != nil {
		return res, err
	}
	if spec.Hardened && seccompMode == SeccompUnconfined {
		return res, errors.New("seccomp unconfined: the hardened box always filters syscalls")
	}
	if spec.MemorySwap != 0 && spec.MemorySwap != -1 && (spec.MemoryLimit == 0 || spec.MemorySwap < int64(spec.MemoryLimit)) {
		return res, fmt.Errorf("memory+swap %d: want -1, 0, or at least the memory limit (%d)", spec.MemorySwap, spec.MemoryLimit)
	}
	img, err := r.client.GetImage(ctx, spec.Image)
	if err != nil {
		return res, fmt.Errorf("image %s: %w", spec.Image, err)
	}
	id := spec.ID
	if id == "" {
		role := spec.Role
		if role == "" {
			role = "run"
		}
		id = "gpupin-" + role + "-" + randomHex(6)
	}
	res.ID = id
	labels := map[string]string{LabelManaged: "true", LabelOwner: owner, LabelRole: spec.Role}
	for k, v := range spec.Labels {
		labels[k] = v
	}

	specOpts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithEnv(spec.Env)}
	if len(spec.Args) > 0 {
		specOpts = append(specOpts, oci.WithProcessArgs(spec.Args...))
	}
	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Destination, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if spec.Hardened {
		mounts = append(mounts, specs.Mount{Type: "tmpfs", Source: "tmpfs", Destination: "/tmp", Options: []string{"nosuid", "nodev", "mode=1777", "size=1g"}})
		specOpts = append(specOpts,
			oci.WithRootFSReadonly(),
			oci.WithNoNewPrivileges,
			oci.WithCapabilities([]string{}),
			oci.WithAmbientCapabilities([]string{}),
		)
	}
	if len(mounts) > 0 {
		specOpts = append(specOpts, oci.WithMounts(mounts))
	}
	if spec.HostNetwork {
		specOpts = append(specOpts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostResolvconf, oci.WithHostHostsFile)
	}
	if spec.MemoryLimit > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(spec.MemoryLimit))
		if swap := spec.MemorySwap; swap != -1 && swapAccounted() {
			if swap == 0 {
				swap = int64(spec.MemoryLimit)
			}
			specOpts = append(specOpts, oci.WithMemorySwap(swap))
		}
	}
	if spec.PidsLimit > 0 {
		specOpts = append(specOpts, oci.WithPidsLimit(spec.PidsLimit))
	}
	runcOpts := &runcoptions.Options{Root: r.runcRoot}
	switch spec.GPUs.Mode {
	case GPUCDI:
		specOpts = append(specOpts, r.withCDI(spec.GPUs.Devices))
	case GPUNvidiaRuntime:
		runcOpts.BinaryName = "nvidia-container-runtime"
		devs := "all"
		if len(spec.GPUs.Devices) > 0 {
			devs = strings.Join(spec.GPUs.Devices, ",")
		}
		specOpts = append(specOpts, oci.WithEnv([]string{"NVIDIA_VISIBLE_DEVICES=" + devs}))
	case GPUNone, "":
	default:
		return res, fmt.Errorf("gpu mode %q", spec.GPUs.Mode)
	}

	if seccompMode == SeccompDefault {
		// Last: the default profile is fitted to the capabilities the
		// container ends up with (CAP_SYS_ADMIN opens unshare and mount,
		// and so on), so every option that changes them comes first.
		specOpts = append(specOpts, seccomp.WithDefaultProfile())
	}

	cont, err := r.client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(r.snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(map[string]string{LabelManaged: "true", LabelOwner: owner})),
		client.WithRuntime("io.containerd.runc.v2", runcOpts),
		client.WithNewSpec(specOpts...),
		client.WithContainerLabels(labels),
	)
	if err != nil {
		// The snapshot is made before the spec; a spec that fails (a CDI
		// device unknown) must not leave it.
		r.client.SnapshotService(r.snapshotter).Remove(context.WithoutCancel(ctx), id)
		return res, fmt.Errorf("create container %s: %w", id, err)
	}
	// Cleanup must run even when ctx is cancelled: a killed probe must not
	// leave its container, task or snapshot.
	defer func() {
		derr := cleanup(ctx, func(ctx context.Context) error { return cont.Delete(ctx, client.WithSnapshotCleanup) })
		if derr != nil && err == nil {
			err = fmt.Errorf("remove container %s: %w", id, derr)
		}
	}()

	limit := spec.OutputLimit
	if limit <= 0 {
		limit = 256 << 10
	}
	out := &tailBuffer{limit: limit}
	var stdout, stderr io.Writer = out, out
	if spec.Stdout != nil {
		stdout = io.MultiWriter(out, spec.Stdout)
	}
	if spec.Stderr != nil {
		stderr = io.MultiWriter(out, spec.Stderr)
	}
	if err := os.MkdirAll(r.fifoDir, 0o700); err != nil {
		return res, fmt.Errorf("fifo dir: %w", err)
	}
	task, err := cont.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(r.fifoDir)))
	if err != nil {
		return res, fmt.Errorf("create task %s: %w", id, err)
	}
	defer func() {
		derr := cleanup(ctx, func(ctx context.Context) error {
			_, err := task.Delete(ctx, client.WithProcessKill)
			return err
		})
		if derr != nil && err == nil {
			err = fmt.Errorf("remove task %s: %w", id, derr)
		}
	}()
	exitCh, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return res, fmt.Errorf("wait task %s: %w", id, err)
	}
	start := time.Now()
	if err := task.Start(ctx); err != nil {
		return res, fmt.Errorf("start task %s: %w", id, err)
	}
	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		t := time.NewTimer(spec.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var status client.ExitStatus
	select {
	case status = <-exitCh:
	case <-timeout:
		res.TimedOut = true
		status = r.kill(ctx, task, exitCh)
	case <-ctx.Done():
		r.kill(ctx, task, exitCh)
		drainOutput(ctx, task)
		res.Duration = time.Since(start)
		res.Output, res.Truncated = out.bytes()
		return res, fmt.Errorf("run %s: %w", id, ctx.Err())
	}
	res.Duration = time.Since(start)
	code, _, serr := status.Result()
	if res.TimedOut {
		// Killed at its timeout: that is the answer, whether or not its
		// exit status came back from the kill.
		if serr != nil {
			r.killLost(ctx, task)
		}
		drainOutput(ctx, task)
		res.Output, res.Truncated = out.bytes()
		res.ExitCode = int(code)
		return res, fmt.Errorf("run %s: killed after %s: %w", id, spec.Timeout, ErrTimeout)
	}
	if serr != nil {
		// containerd lost the task's exit (it restarted, or went away):
		// the process may still run in its shim, holding its output open.
		// Kill it so nothing runs unwatched, and drain what came so far.
		r.killLost(ctx, task)
	}
	drainOutput(ctx, task)
	res.Output, res.Truncated = out.bytes()
	if serr != nil {
		return res, fmt.Errorf("task %s: lost its exit status (did containerd restart?): %w", id, serr)
	}
	res.ExitCode = int(code)
	return res, nil
}

// swapAccounted reports whether the kernel can bound a cgroup's swap. On
// cgroup v1 that is memory.memsw.*, present only with swap accounting
// (swapaccount=1, the default since Linux 5.8); runc fails to start a
// container whose swap limit it cannot write. cgroup v2 always takes the
// limit (runc ignores it where swap is off).
func swapAccounted() bool {
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		return true // cgroup v2 (or no memory controller: runc says so)
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	return err == nil
}

func (r *Runtime) kill(ctx context.Context, task client.Task, exitCh <-chan client.ExitStatus) client.ExitStatus {
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
func (r *Runtime) killLost(ctx context.Context, task client.Task) {
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

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
