package containerd

import (
	"context"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd/run"
)

// The runs' types (package run).
type (
	Mount     = run.Mount
	RunSpec   = run.RunSpec
	RunResult = run.RunResult
	Seccomp   = run.Seccomp
	GPUMode   = run.GPUMode
	GPUs      = run.GPUs
)

const (
	SeccompDefault    = run.SeccompDefault
	SeccompUnconfined = run.SeccompUnconfined

	GPUCDI           = run.GPUCDI
	GPUNvidiaRuntime = run.GPUNvidiaRuntime
	GPUNone          = run.GPUNone
	// DefaultCDIDevice is every GPU, as nvidia-ctk names it.
	DefaultCDIDevice = run.DefaultCDIDevice
)

// ErrTimeout marks a run killed at its timeout.
var ErrTimeout = run.ErrTimeout

// ParseSeccomp reads a --seccomp value.
func ParseSeccomp(s string) (Seccomp, error) { return run.ParseSeccomp(s) }

// ParseGPUs reads how GPUs reach a container, and which (run.ParseGPUs).
func ParseGPUs(mode string, devices []string) (GPUs, error) { return run.ParseGPUs(mode, devices) }

// DefaultGPUs is how GPUs reach a container when nothing else is asked.
func DefaultGPUs(simulated bool) GPUs { return run.DefaultGPUs(simulated) }

// Run runs a container of spec.Image to its end or its timeout and removes
// it, whatever happens (run.Runner.Run).
func (r *Runtime) Run(ctx context.Context, spec RunSpec) (RunResult, error) {
	return r.run.Run(ctx, spec)
}

// ImageConfig returns the config of an image record for the platform.
func (r *Runtime) ImageConfig(ctx context.Context, name, platform string) (ocispec.ImageConfig, error) {
	return r.run.ImageConfig(ctx, name, platform)
}
