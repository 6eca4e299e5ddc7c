package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
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
	// Whoever looked the record up, a name that says one digest and a
	// target that is another is not the image that was proved.
	if m := img.Metadata(); tampered(m) {
		return res, fmt.Errorf("run %s: %w: the record points at %s, not the digest its name says; it was changed outside gpupin and is never run (gpupin gc removes it)",
			spec.Image, ErrTampered, m.Target.Digest)
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

	specOpts, runcOpts, err := r.specFor(img, spec, seccompMode)
	if err != nil {
		return res, err
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
	st := awaitTask(ctx, task, exitCh, spec.Timeout)
	res.Duration = time.Since(start)
	res.TimedOut = st.timedOut
	res.ExitCode = st.code
	drainOutput(ctx, task)
	res.Output, res.Truncated = out.bytes()
	switch {
	case st.cancelled:
		return res, fmt.Errorf("run %s: %w", id, ctx.Err())
	case st.timedOut:
		return res, fmt.Errorf("run %s: killed after %s: %w", id, spec.Timeout, ErrTimeout)
	case st.lost != nil:
		return res, fmt.Errorf("task %s: lost its exit status (did containerd restart?): %w", id, st.lost)
	}
	return res, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
