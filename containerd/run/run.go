package run

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/gpupin/gpupin/containerd/conn"
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
func (r *Runner) Run(ctx context.Context, spec RunSpec) (res RunResult, err error) {
	ctx = r.conn.Ctx(ctx)
	seccompMode, err := spec.check()
	if err != nil {
		return res, err
	}
	img, err := r.runnable(ctx, spec.Image)
	if err != nil {
		return res, err
	}
	res.ID = spec.containerID()
	cont, err := r.newContainer(ctx, img, res.ID, spec, seccompMode)
	if err != nil {
		return res, err
	}
	// Cleanup must run even when ctx is cancelled: a killed probe must not
	// leave its container, task or snapshot.
	defer func() {
		derr := conn.Cleanup(ctx, func(ctx context.Context) error { return cont.Delete(ctx, client.WithSnapshotCleanup) })
		if derr != nil && err == nil {
			err = fmt.Errorf("remove container %s: %w", res.ID, derr)
		}
	}()
	return r.runTask(ctx, cont, spec, res)
}

// check refuses a spec that contradicts itself, and returns its filter.
func (spec RunSpec) check() (Seccomp, error) {
	mode, err := ParseSeccomp(string(spec.Seccomp))
	if err != nil {
		return "", err
	}
	if spec.Hardened && mode == SeccompUnconfined {
		return "", errors.New("seccomp unconfined: the hardened box always filters syscalls")
	}
	if spec.MemorySwap != 0 && spec.MemorySwap != -1 && (spec.MemoryLimit == 0 || spec.MemorySwap < int64(spec.MemoryLimit)) {
		return "", fmt.Errorf("memory+swap %d: want -1, 0, or at least the memory limit (%d)", spec.MemorySwap, spec.MemoryLimit)
	}
	return mode, nil
}

// containerID is the spec's ID, else role-random.
func (spec RunSpec) containerID() string {
	if spec.ID != "" {
		return spec.ID
	}
	return "gpupin-" + cmp.Or(spec.Role, "run") + "-" + strings.ToLower(rand.Text())
}

// runnable looks the image record up and refuses a tampered one: whoever
// looked it up, a name that says one digest and a target that is another
// is not the image that was proved.
func (r *Runner) runnable(ctx context.Context, name string) (client.Image, error) {
	img, err := r.conn.Client.GetImage(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	if m := img.Metadata(); conn.Tampered(m) {
		return nil, fmt.Errorf("run: %w", conn.TamperedError(name, m.Target.Digest))
	}
	return img, nil
}

// newContainer creates the container and its snapshot, labelled as
// gpupin's and its owner's so a sweep finds them if this process dies.
func (r *Runner) newContainer(ctx context.Context, img client.Image, id string, spec RunSpec, seccompMode Seccomp) (client.Container, error) {
	labels := map[string]string{conn.LabelManaged: "true", conn.LabelOwner: conn.Owner(), conn.LabelRole: spec.Role}
	maps.Copy(labels, spec.Labels)
	specOpts, runcOpts, err := r.specFor(img, spec, seccompMode)
	if err != nil {
		return nil, err
	}
	cont, err := r.conn.Client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(r.conn.Snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(map[string]string{conn.LabelManaged: "true", conn.LabelOwner: conn.Owner()})),
		client.WithRuntime("io.containerd.runc.v2", runcOpts),
		client.WithNewSpec(specOpts...),
		client.WithContainerLabels(labels),
	)
	if err != nil {
		// The snapshot is made before the spec; a spec that fails (a CDI
		// device unknown) must not leave it.
		r.conn.Client.SnapshotService(r.conn.Snapshotter).Remove(context.WithoutCancel(ctx), id)
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	return cont, nil
}

// runTask starts the container's task, waits for its end (awaitTask),
// removes the task, and says how it ended.
func (r *Runner) runTask(ctx context.Context, cont client.Container, spec RunSpec, res RunResult) (_ RunResult, err error) {
	out, stdout, stderr := spec.outputs()
	if err := os.MkdirAll(r.fifoDir, 0o700); err != nil {
		return res, fmt.Errorf("fifo dir: %w", err)
	}
	task, err := cont.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(r.fifoDir)))
	if err != nil {
		return res, fmt.Errorf("create task %s: %w", res.ID, err)
	}
	defer func() {
		derr := conn.Cleanup(ctx, func(ctx context.Context) error {
			_, err := task.Delete(ctx, client.WithProcessKill)
			return err
		})
		if derr != nil && err == nil {
			err = fmt.Errorf("remove task %s: %w", res.ID, derr)
		}
	}()
	exitCh, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return res, fmt.Errorf("wait task %s: %w", res.ID, err)
	}
	start := time.Now()
	if err := task.Start(ctx); err != nil {
		return res, fmt.Errorf("start task %s: %w", res.ID, err)
	}
	st := awaitTask(ctx, task, exitCh, spec.Timeout)
	res.Duration, res.TimedOut, res.ExitCode = time.Since(start), st.timedOut, st.code
	drainOutput(ctx, task)
	res.Output, res.Truncated = out.bytes()
	switch {
	case st.cancelled:
		return res, fmt.Errorf("run %s: %w", res.ID, ctx.Err())
	case st.timedOut:
		return res, fmt.Errorf("run %s: killed after %s: %w", res.ID, spec.Timeout, ErrTimeout)
	case st.lost != nil:
		return res, fmt.Errorf("task %s: lost its exit status (did containerd restart?): %w", res.ID, st.lost)
	}
	return res, nil
}

// outputs is where a run's output goes: a tail kept (OutputLimit, default
// 256 KiB), and the spec's own writers as it comes.
func (spec RunSpec) outputs() (out *tailBuffer, stdout, stderr io.Writer) {
	out = &tailBuffer{limit: cmp.Or(max(spec.OutputLimit, 0), 256<<10)}
	stdout, stderr = out, out
	if spec.Stdout != nil {
		stdout = io.MultiWriter(out, spec.Stdout)
	}
	if spec.Stderr != nil {
		stderr = io.MultiWriter(out, spec.Stderr)
	}
	return out, stdout, stderr
}
