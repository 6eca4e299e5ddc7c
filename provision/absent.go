package provision

import (
	"context"
	"errors"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/runtime"
)

var errNoRuntime = errors.New("the provisioner has no runtime (containerd)")

// absent is the runtime of a provisioner made without one (New(nil)):
// every call says so, and Plan, which needs no containerd, reads that as
// no pins.
type absent struct{}

func (absent) Pins(context.Context) ([]runtime.Pin, error)         { return nil, errNoRuntime }
func (absent) ListPins(context.Context) ([]runtime.Pin, error)     { return nil, errNoRuntime }
func (absent) PreviousPins(context.Context) ([]runtime.Pin, error) { return nil, errNoRuntime }
func (absent) SetPin(context.Context, runtime.Pin, runtime.SetPinOptions) error {
	return errNoRuntime
}
func (absent) DiscardCandidate(context.Context, string) error { return errNoRuntime }
func (absent) WithLease(context.Context, func(context.Context) error) error {
	return errNoRuntime
}
func (absent) Pull(context.Context, string, runtime.PullOptions) (runtime.Pulled, error) {
	return runtime.Pulled{}, errNoRuntime
}
func (absent) Registry() *registry.Policy { return nil }
func (absent) Prefetch(context.Context, string, runtime.PullOptions, int64) (func(), error) {
	return nil, errNoRuntime
}
func (absent) ImageConfig(context.Context, string, string) (ocispec.ImageConfig, error) {
	return ocispec.ImageConfig{}, errNoRuntime
}
func (absent) Run(context.Context, runtime.RunSpec) (runtime.RunResult, error) {
	return runtime.RunResult{}, errNoRuntime
}
func (absent) Sweep(context.Context) (runtime.Swept, error) { return runtime.Swept{}, errNoRuntime }
func (absent) Namespace() string                            { return "" }
