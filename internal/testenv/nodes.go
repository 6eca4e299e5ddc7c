package testenv

import (
	"context"
	"sync"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/node"
)

// The two variants most tests publish: cu13 has no kernels below 7.5 (as
// CUDA 13 dropped them), cu129 reaches Hopper by PTX.
var (
	CU13  = sandbox.EngineVariant{Name: "cu13", CUDA: "13.0", Archs: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX"}
	CU129 = sandbox.EngineVariant{Name: "cu129", CUDA: "12.9", Archs: "7.0,7.5,8.0,8.6,8.9,9.0+PTX"}
)

// H100UUID is the simulated H100's UUID.
const H100UUID = "GPU-11111111-2222-3333-4444-555555555555"

// H100 is a simulated node with one H100 on the given driver.
func H100(driver, cuda string) *node.Facts {
	return &node.Facts{Driver: driver, CUDA: cuda, Platform: "linux/amd64", Simulated: true,
		GPUs: []node.GPU{{Index: 0, UUID: H100UUID, Name: "NVIDIA H100 80GB HBM3", Brand: "nvidia", CC: "9.0", MemoryMiB: 81559}}}
}

// Node is a simulated node whose facts a test can change under a running
// provisioner, as a driver upgrade would.
type Node struct {
	mu sync.Mutex
	f  *node.Facts
}

// NewNode starts a simulated node with facts f.
func NewNode(f *node.Facts) *Node { return &Node{f: f} }

// Read returns a copy of the current facts.
func (n *Node) Read(context.Context) (*node.Facts, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := *n.f
	c.GPUs = append([]node.GPU(nil), n.f.GPUs...)
	return &c, nil
}

// Set changes the facts.
func (n *Node) Set(f *node.Facts) { n.mu.Lock(); n.f = f; n.mu.Unlock() }
