package probe

// Kind names a probe, as the io.gpupin.probe annotation does.
type Kind string

const (
	Torch Kind = "torch" // Python + PyTorch images (vLLM, SGLang)
	CUDA  Kind = "cuda"  // any glibc image: the driver API with a PTX kernel
	Exec  Kind = "exec"  // the image's own self-test, named in io.gpupin.probe.exec
	// Sim emulates a GPU verdict on a node without one; only simulated nodes use it.
	Sim Kind = "sim"
)

// MountDir is where gpupin bind-mounts probe programs, read-only, in the container.
const MountDir = "/.gpupin-probe"

// Mount is a read-only bind mount of a host file into the probe container.
type Mount struct {
	Source      string // host path
	Destination string // path in the container
}

// Program is what runs in the probe container: the mounts it needs, its argv
// and extra environment.
type Program struct {
	Kind   Kind
	Mounts []Mount
	Args   []string
	Env    []string
}
