//go:build !cgo || nonvml

package node

import "context"

type noNVML struct{}

// NewReader returns a reader that reports the node unsupported: this binary
// was built without cgo, so it cannot load NVML.
func NewReader() Reader { return noNVML{} }

// BuiltWithNVML tells whether this binary can read NVML.
const BuiltWithNVML = false

func (noNVML) Read(context.Context) (*Facts, error) {
	return &Facts{
		Platform:    HostPlatform(),
		GPUs:        []GPU{},
		Unsupported: "built without NVML (cgo disabled or the nonvml tag); read node facts from a file instead (node.File; what `gpupin detect --json` prints)",
	}, nil
}
