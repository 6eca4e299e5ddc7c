package probe

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
)

// SimScriptName is the simulated probe's file name in the container.
const SimScriptName = "sim.sh"

// SimScript is the simulated probe, a POSIX sh script (see sim.sh for its contract).
//
//go:embed sim.sh
var SimScript []byte

// SimOptions configures the simulated probe.
type SimOptions struct {
	Devices  []Device // echoed in the verdict
	NodeCUDA string   // the CUDA version the simulated driver supports, e.g. "12.9"; "" skips the check
}

// cudaVersionRE accepts what node facts hold ("12.9", "13", "12.9.1"); the
// script compares major.minor.
var cudaVersionRE = regexp.MustCompile(`^[0-9]{1,9}(\.[0-9]{1,9}){0,3}$`)

// buildSim stages sim.sh and passes the simulated node to it as environment:
// GPUPIN_SIM_DEVICES (JSON) and GPUPIN_SIM_NODE_CUDA.
func buildSim(opt Options) (Program, error) {
	s := opt.Sim
	if len(s.Devices) == 0 {
		return Program{}, errors.New("sim probe: no simulated devices")
	}
	if s.NodeCUDA != "" && !cudaVersionRE.MatchString(s.NodeCUDA) {
		return Program{}, fmt.Errorf("sim probe: node CUDA version %q is not a version like 12.9", s.NodeCUDA)
	}
	devs, err := json.Marshal(s.Devices)
	if err != nil {
		return Program{}, fmt.Errorf("sim probe: encode devices: %w", err)
	}
	src, err := stage(opt.Dir, SimScriptName, SimScript, 0o644)
	if err != nil {
		return Program{}, fmt.Errorf("sim probe: %w", err)
	}
	dst := path.Join(MountDir, SimScriptName)
	return Program{
		Kind:   Sim,
		Mounts: []Mount{{Source: src, Destination: dst}},
		Args:   []string{"/bin/sh", dst},
		Env: []string{
			"GPUPIN_SIM_DEVICES=" + string(devs),
			"GPUPIN_SIM_NODE_CUDA=" + s.NodeCUDA,
		},
	}, nil
}
