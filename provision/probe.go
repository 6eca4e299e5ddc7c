package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/runtime"
)

// Probe runs an image's probe in a container of that image (already
// pulled, as the record named image), with the same box and checks a
// provision uses, and pins nothing. It returns the verdict and the tail of
// the probe's output. `gpupin probe` calls it alone.
//
// On simulated facts (no GPU) the image's own probe still runs, in its
// simulated mode: everything that needs no device is checked for real, and
// the verdict names the checks that were simulated. Only an image that sets
// GPUPIN_SIM_PROBE (a test or demo fixture), or an operator's --probe sim
// where the image names no probe, gets the emulator (gpupin-sim-probe).
func (p *Provisioner) Probe(ctx context.Context, image string, meta images.Metadata, engine string, facts *node.Facts) (*probe.Verdict, string, error) {
	if !facts.Simulated && !facts.Supported() {
		return nil, "", fmt.Errorf("unsupported: %s", facts.Unsupported)
	}
	engine = probe.EngineFamily(engine)
	kind, err := probe.Select(meta.Probe, engine, p.opts.DefaultProbe)
	if err != nil {
		return nil, "", err
	}
	gpus := runtime.DefaultGPUs(facts.Simulated)
	popts := probe.Options{Dir: p.opts.ProbeDir, CUDAProbeBinary: p.opts.CUDAProbeBinary, SimProbeBinary: p.opts.SimProbeBinary, Engine: engine}
	var cfg *ocispec.ImageConfig
	config := func() (*ocispec.ImageConfig, error) {
		if cfg == nil {
			c, err := p.rt.ImageConfig(ctx, image, facts.Platform)
			if err != nil {
				return nil, err
			}
			cfg = &c
		}
		return cfg, nil
	}
	if facts.Simulated {
		// No GPU to prove on: the probe runs in its simulated mode, in
		// the real container, told about the simulated GPUs and driver.
		c, err := config()
		if err != nil {
			return nil, "", err
		}
		popts.Simulated = true
		for _, g := range facts.GPUs {
			popts.Sim.Devices = append(popts.Sim.Devices, probe.Device{Index: g.Index, UUID: g.UUID, Name: g.Name, CC: g.CC})
		}
		popts.Sim.NodeCUDA = facts.CUDA
		popts.Sim.VariantCUDA = variantCUDA(meta, c)
		if probe.SimProbeMode(c.Env) != "" {
			// A fixture asking to be emulated, or to misbehave on purpose.
			kind = probe.Sim
		}
	}
	if p.opts.GPUs != nil {
		gpus = *p.opts.GPUs
	}
	if kind == probe.Exec {
		argvLabel := meta.ProbeExec
		if argvLabel == "" {
			c, err := config()
			if err != nil {
				return nil, "", err
			}
			argvLabel = c.Labels[images.AnnotationProbeExec]
		}
		if argvLabel != "" {
			if popts.ExecArgv, err = probe.ParseExecLabel(argvLabel); err != nil {
				return nil, "", err
			}
		}
	}
	prog, err := probe.Build(kind, popts)
	if err != nil {
		return nil, "", err
	}
	var mounts []runtime.Mount
	for _, m := range prog.Mounts {
		mounts = append(mounts, runtime.Mount{Source: m.Source, Destination: m.Destination})
	}
	res, err := p.rt.Run(ctx, runtime.RunSpec{
		Image: image, Args: prog.Args, Env: prog.Env, Mounts: mounts, GPUs: gpus, Hardened: true, Role: "probe",
		MemoryLimit: p.opts.ProbeMemory, PidsLimit: p.opts.ProbePids, Timeout: p.opts.ProbeTimeout,
	})
	if err != nil {
		if errors.Is(err, runtime.ErrTimeout) {
			f := probe.NewFailure(fmt.Sprintf("%s probe did not finish in %s and was killed", kind, p.opts.ProbeTimeout), res.Output)
			return nil, f.Tail, f
		}
		if reason := probe.Explain(prog, res.Output, err); reason != "" {
			f := probe.NewFailure(reason, res.Output)
			return nil, f.Tail, f
		}
		return nil, probe.Tail(res.Output), fmt.Errorf("%s probe: %w", kind, err)
	}
	v, err := probe.Parse(res.Output, res.ExitCode)
	if err != nil {
		if v == nil {
			// No verdict: a program that could not start says why here.
			if reason := probe.Explain(prog, res.Output, nil); reason != "" {
				f := probe.NewFailure(reason, res.Output)
				return nil, f.Tail, f
			}
		}
		return nil, probe.Tail(res.Output), err
	}
	if !facts.Simulated && len(v.SimulatedChecks) > 0 {
		// A verdict that skipped checks proves nothing on a node with GPUs.
		f := probe.NewFailure(fmt.Sprintf("the probe simulated checks on a node with GPUs (%s); its verdict proves nothing here",
			strings.Join(v.SimulatedChecks, "; ")), res.Output)
		return nil, f.Tail, f
	}
	if allGPUs(gpus) {
		// The pin will say "proved on these GPUs": every one of them.
		missing, err := uncovered(kind, facts.GPUs, v.Devices)
		if err != nil {
			f := probe.NewFailure(err.Error(), res.Output)
			return nil, f.Tail, f
		}
		if len(missing) > 0 {
			f := probe.NewFailure(fmt.Sprintf("the probe did not compute on all of the node's %d GPUs; missing %s (is CUDA_VISIBLE_DEVICES set in the image, or the CDI spec stale?)",
				len(facts.GPUs), strings.Join(missing, ", ")), res.Output)
			return nil, f.Tail, f
		}
	}
	if facts.Simulated && len(v.SimulatedChecks) == 0 {
		// A probe that knows nothing of simulation (an image's self-test)
		// still did no device work here: the verdict must say so.
		v.SimulatedChecks = []string{"all device work (the node is simulated; the probe named no simulated checks)"}
	}
	if v.Runtime == nil {
		v.Runtime = map[string]any{}
	}
	// Which probe ran, as gpupin chose it (on a simulated node, perhaps
	// not the one the image names).
	v.Runtime["probe"] = string(kind)
	v.Simulated = facts.Simulated
	return v, probe.Tail(res.Output), nil
}

// variantCUDA is the CUDA the variant targets: its metadata, else the
// image's own label, else the CUDA_VERSION its environment sets.
func variantCUDA(meta images.Metadata, cfg *ocispec.ImageConfig) string {
	for _, v := range []string{meta.CUDA, cfg.Labels[images.AnnotationCUDA]} {
		if v = strings.TrimSpace(v); probe.ValidCUDAVersion(v) {
			return v
		}
	}
	return probe.ImageCUDA(cfg.Env)
}

// allGPUs reports whether a probe run was given every GPU of the node.
func allGPUs(g runtime.GPUs) bool {
	switch g.Mode {
	case runtime.GPUCDI:
		return len(g.Devices) == 1 && g.Devices[0] == runtime.DefaultCDIDevice
	case runtime.GPUNvidiaRuntime:
		return len(g.Devices) == 0 || (len(g.Devices) == 1 && g.Devices[0] == "all")
	case runtime.GPUNone:
		return true // the simulated probe reports the node's GPUs
	}
	return false
}

// uncovered lists the node's GPUs a verdict does not report. Devices are
// matched by UUID. gpupin's own probes (torch, cuda) must report each
// device's UUID, and a device without one is an error; only an image's
// own self-test (exec), which may not print them, and the emulator of a
// simulated node are held to the count instead. Under MIG the probe sees
// instances, not GPUs: there it must have seen at least as many devices
// as the node has GPUs.
func uncovered(kind probe.Kind, gpus []node.GPU, devs []probe.Device) ([]string, error) {
	seen := map[string]bool{}
	withUUID := 0
	var without []string
	for _, d := range devs {
		if d.UUID != "" {
			seen[strings.ToLower(d.UUID)] = true
			withUUID++
		} else {
			without = append(without, fmt.Sprintf("device %d", d.Index))
		}
	}
	if len(without) > 0 && kind != probe.Exec && kind != probe.Sim {
		return nil, fmt.Errorf("the %s probe reported %s without a UUID: gpupin's own probes must name each GPU they computed on by its UUID (only an exec probe is held to the count)",
			kind, strings.Join(without, ", "))
	}
	mig := false
	for _, g := range gpus {
		mig = mig || g.MIG == "enabled"
	}
	if mig || withUUID < len(devs) || withUUID == 0 {
		if len(devs) >= len(gpus) {
			return nil, nil
		}
		return []string{fmt.Sprintf("%d of them (it reported %d devices)", len(gpus)-len(devs), len(devs))}, nil
	}
	var missing []string
	for _, g := range gpus {
		if !seen[strings.ToLower(g.UUID)] {
			missing = append(missing, fmt.Sprintf("GPU %d (%s, %s)", g.Index, g.Name, g.UUID))
		}
	}
	return missing, nil
}
