package run

import (
	"context"
	"fmt"
	"os"
	"strings"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// specFor builds a run's OCI spec options and runc options: the image's
// config with the run's args and env, its mounts, the box, limits, GPUs,
// and the syscall filter last.
func (r *Runner) specFor(img client.Image, spec RunSpec, seccompMode Seccomp) ([]oci.SpecOpts, *runcoptions.Options, error) {
	opts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithEnv(spec.Env)}
	if len(spec.Args) > 0 {
		opts = append(opts, oci.WithProcessArgs(spec.Args...))
	}
	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Destination, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if spec.Hardened {
		mounts = append(mounts, specs.Mount{Type: "tmpfs", Source: "tmpfs", Destination: "/tmp", Options: []string{"nosuid", "nodev", "mode=1777", "size=1g"}})
		opts = append(opts, withHardening)
	}
	if len(mounts) > 0 {
		opts = append(opts, oci.WithMounts(mounts))
	}
	if spec.HostNetwork {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostResolvconf, oci.WithHostHostsFile)
	}
	opts = append(opts, withLimits(spec))
	runcOpts := &runcoptions.Options{Root: r.runcRoot}
	switch spec.GPUs.Mode {
	case GPUCDI:
		opts = append(opts, r.withCDI(spec.GPUs.Devices))
	case GPUNvidiaRuntime:
		runcOpts.BinaryName = "nvidia-container-runtime"
		devs := "all"
		if len(spec.GPUs.Devices) > 0 {
			devs = strings.Join(spec.GPUs.Devices, ",")
		}
		opts = append(opts, oci.WithEnv([]string{"NVIDIA_VISIBLE_DEVICES=" + devs}))
	case GPUNone, "":
	default:
		return nil, nil, fmt.Errorf("gpu mode %q", spec.GPUs.Mode)
	}
	if seccompMode == SeccompDefault {
		// Last: the default profile is fitted to the capabilities the
		// container ends up with (CAP_SYS_ADMIN opens unshare and mount,
		// and so on), so every option that changes them comes first.
		opts = append(opts, seccomp.WithDefaultProfile())
	}
	return opts, runcOpts, nil
}

// withHardening is the probe's box, less what needs the run's own values
// (the /tmp tmpfs, limits): a read-only root, no new privileges, no
// capabilities. Its network is its own namespace with only lo, as a
// container without WithHostNamespace has.
func withHardening(ctx context.Context, c oci.Client, cont *containers.Container, s *oci.Spec) error {
	for _, o := range []oci.SpecOpts{
		oci.WithRootFSReadonly(),
		oci.WithNoNewPrivileges,
		oci.WithCapabilities([]string{}),
		oci.WithAmbientCapabilities([]string{}),
	} {
		if err := o(ctx, c, cont, s); err != nil {
			return err
		}
	}
	return nil
}

// withLimits sets the memory (swap bounded with it unless asked
// otherwise) and pids limits a run asks for.
func withLimits(spec RunSpec) oci.SpecOpts {
	return func(ctx context.Context, c oci.Client, cont *containers.Container, s *oci.Spec) error {
		var opts []oci.SpecOpts
		if spec.MemoryLimit > 0 {
			opts = append(opts, oci.WithMemoryLimit(spec.MemoryLimit))
			if swap := spec.MemorySwap; swap != -1 && swapAccounted() {
				if swap == 0 {
					swap = int64(spec.MemoryLimit)
				}
				opts = append(opts, oci.WithMemorySwap(swap))
			}
		}
		if spec.PidsLimit > 0 {
			opts = append(opts, oci.WithPidsLimit(spec.PidsLimit))
		}
		for _, o := range opts {
			if err := o(ctx, c, cont, s); err != nil {
				return err
			}
		}
		return nil
	}
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
