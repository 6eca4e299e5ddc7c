package provision

import (
	"context"
	"errors"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/registry"
)

var errNoRuntime = errors.New("the provisioner has no runtime (containerd)")

// absent is the runtime of a provisioner made without one (New(nil)):
// every call says so, and Plan, which needs no containerd, reads that as
// no pins.
type absent struct{}

func (absent) Pins(context.Context) ([]containerd.Pin, error)         { return nil, errNoRuntime }
func (absent) ListPins(context.Context) ([]containerd.Pin, error)     { return nil, errNoRuntime }
func (absent) PreviousPins(context.Context) ([]containerd.Pin, error) { return nil, errNoRuntime }
func (absent) SetPin(context.Context, containerd.Pin, containerd.SetPinOptions) error {
	return errNoRuntime
}
func (absent) DiscardCandidate(context.Context, string) error { return errNoRuntime }
func (absent) WithLease(context.Context, func(context.Context) error) error {
	return errNoRuntime
}
func (absent) Pull(context.Context, string, containerd.PullOptions) (containerd.Pulled, error) {
	return containerd.Pulled{}, errNoRuntime
}
func (absent) Registry() *registry.Policy { return nil }
func (absent) Prefetch(context.Context, string, containerd.PullOptions, int64) (func(), error) {
	return nil, errNoRuntime
}
func (absent) ImageConfig(context.Context, string, string) (ocispec.ImageConfig, error) {
	return ocispec.ImageConfig{}, errNoRuntime
}
func (absent) Run(context.Context, containerd.RunSpec) (containerd.RunResult, error) {
	return containerd.RunResult{}, errNoRuntime
}
func (absent) Sweep(context.Context) (containerd.Swept, error) {
	return containerd.Swept{}, errNoRuntime
}
func (absent) Namespace() string { return "" }
