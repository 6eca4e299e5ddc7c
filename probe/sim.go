package probe

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// SimProbeName is the file name of the sim probe binary (cmd/gpupin-sim-probe),
// on the host and in the container. It is static, so it runs in any image:
// scratch and distroless images have no shell to run a script with.
const SimProbeName = "gpupin-sim-probe"

// The environment of a probe on a simulated node (see docs/probe-protocol.md).
const (
	// EnvSimulated is "1" on a simulated node, "0" on a real one: the probes
	// skip exactly what needs a device when it is "1".
	EnvSimulated = "GPUPIN_SIMULATED"
	// EnvSimDevices is the simulated GPUs, a JSON array of Device.
	EnvSimDevices = "GPUPIN_SIM_DEVICES"
	// EnvSimNodeCUDA is the CUDA version the simulated driver supports ("" = unknown).
	EnvSimNodeCUDA = "GPUPIN_SIM_NODE_CUDA"
	// EnvSimVariantCUDA is the CUDA the variant says it targets
	// (io.gpupin.cuda.version, else the image's CUDA_VERSION; "" = unknown).
	EnvSimVariantCUDA = "GPUPIN_SIM_VARIANT_CUDA"
	// EnvSimProbe, set in a test image's own environment, makes gpupin run
	// the sim probe (the emulator) on a simulated node instead of the
	// image's probe, and names how it behaves (SimModes).
	EnvSimProbe = "GPUPIN_SIM_PROBE"
)

// SimModes are the values of GPUPIN_SIM_PROBE: emulate gives the verdict a
// GPU would for the node (the image's CUDA_VERSION against the simulated
// driver); the others misbehave on purpose, for tests and demos.
var SimModes = []string{"emulate", "fail", "hang", "garbled", "noline", "exit1", "big"}

// SimOptions describes the simulated node to a probe.
type SimOptions struct {
	Devices  []Device // the simulated GPUs, reported in the verdict
	NodeCUDA string   // the CUDA version the simulated driver supports, e.g. "12.9"; "" skips the check
	// VariantCUDA is the CUDA the variant targets, e.g. "12.9"; the torch
	// probe checks that torch.version.cuda agrees. "" skips the check.
	VariantCUDA string
}

// cudaVersionRE accepts what node facts and images hold ("12.9", "13",
// "12.9.1"); the probes compare major.minor.
var cudaVersionRE = regexp.MustCompile(`^[0-9]{1,9}(\.[0-9]{1,9}){0,3}$`)

// ValidCUDAVersion reports whether s reads as a CUDA version: 13, 12.9, 12.9.1.
func ValidCUDAVersion(s string) bool { return cudaVersionRE.MatchString(s) }

// env is the environment that tells a probe the node is simulated.
func (s SimOptions) env() ([]string, error) {
	if len(s.Devices) == 0 {
		return nil, errors.New("no simulated devices")
	}
	for name, v := range map[string]string{"node": s.NodeCUDA, "variant": s.VariantCUDA} {
		if v != "" && !cudaVersionRE.MatchString(v) {
			return nil, fmt.Errorf("%s CUDA version %q is not a version like 12.9", name, v)
		}
	}
	devs, err := json.Marshal(s.Devices)
	if err != nil {
		return nil, fmt.Errorf("encode devices: %w", err)
	}
	return []string{
		EnvSimulated + "=1",
		EnvSimDevices + "=" + string(devs),
		EnvSimNodeCUDA + "=" + s.NodeCUDA,
		EnvSimVariantCUDA + "=" + s.VariantCUDA,
	}, nil
}

// SimProbeMode returns the GPUPIN_SIM_PROBE value an image's environment
// (its config's Env) sets, "" when none: on a simulated node, an image
// that sets it gets the sim probe instead of its own.
func SimProbeMode(env []string) string {
	return lookupEnv(env, EnvSimProbe)
}

// ImageCUDA returns the CUDA_VERSION an image's environment sets (what
// NVIDIA's CUDA base images carry), "" when none or not a version.
func ImageCUDA(env []string) string {
	v := lookupEnv(env, "CUDA_VERSION")
	if !ValidCUDAVersion(v) {
		return ""
	}
	return v
}

// lookupEnv returns the last value of key in env, as a process would see it.
func lookupEnv(env []string, key string) string {
	val := ""
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			val = v
		}
	}
	return strings.TrimSpace(val)
}
