package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
)

// Runner runs a container to its end, and reads an image's config (the
// probe's mounts and defaults come from it).
type Runner interface {
	ImageConfig(ctx context.Context, name, platform string) (ocispec.ImageConfig, error)
	Run(ctx context.Context, spec containerd.RunSpec) (containerd.RunResult, error)
}

// Probe runs an image's probe in a container of that image (already
// pulled, as the record named image), with the same box and checks a
// provision uses, and pins nothing. It returns the verdict and the tail of
// the probe's output; a failed probe is a *probe.Failure.
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
	run, err := p.prepareProbe(ctx, image, meta, engine, facts)
	if err != nil {
		return nil, "", err
	}
	res, err := p.rt.Run(ctx, containerd.RunSpec{
		Image: image, Args: run.prog.Args, Env: run.prog.Env, Mounts: run.mounts(), GPUs: run.gpus, Hardened: true, Role: "probe",
		MemoryLimit: p.opts.ProbeMemory, PidsLimit: p.opts.ProbePids, Timeout: p.opts.ProbeTimeout,
	})
	tail := probe.Tail(res.Output)
	if err != nil {
		return nil, tail, run.runFailed(res.Output, err, p.opts.ProbeTimeout)
	}
	v, err := run.judge(res.Output, res.ExitCode, facts)
	if err != nil {
		return nil, tail, err
	}
	return v, tail, nil
}

// ProbeReport is a probe of an image alone (ProbeImage): what was probed
// and why that probe, its verdict, and how long it took.
type ProbeReport struct {
	Image   string
	Target  *ProbeTarget
	Verdict *probe.Verdict
	// Output is the tail of the probe's output.
	Output   string
	Duration time.Duration
}

// ProbeImage is `gpupin probe`: it reads an image already pulled as a
// provision reads it (ProbeTarget), runs the probe a provision would run
// (Probe), and pins nothing. An image that cannot be read returns no
// report (ErrInvalidWant, ErrUnsupported, ErrNotPulled, …); a probe that
// fails returns its report and its error (a *probe.Failure).
func (p *Provisioner) ProbeImage(ctx context.Context, image string, as ProbeAs) (*ProbeReport, error) {
	t, err := p.ProbeTarget(ctx, image, as)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	v, out, err := p.Probe(ctx, image, t.Meta, t.Engine, t.Node)
	return &ProbeReport{Image: image, Target: t, Verdict: v, Output: out, Duration: time.Since(start)}, err
}

// probeRun is a probe about to run: which one, its program, and the GPUs
// it is given.
type probeRun struct {
	kind probe.Kind
	prog probe.Program
	gpus containerd.GPUs
}

// prepareProbe chooses the probe (probeKind; the emulator for a simulated
// fixture that asks for it), stages its program, and reads what it needs
// of the image's config: the simulated node's CUDA, an exec self-test's
// argv.
func (p *Provisioner) prepareProbe(ctx context.Context, image string, meta images.Metadata, engine string, facts *node.Facts) (*probeRun, error) {
	kind, err := p.probeKind(meta, engine)
	if err != nil {
		return nil, err
	}
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
	popts := probe.Options{Dir: p.opts.ProbeDir, CUDAProbeBinary: p.opts.CUDAProbeBinary, SimProbeBinary: p.opts.SimProbeBinary,
		Engine: probe.EngineFamily(engine)}
	if facts.Simulated {
		c, err := config()
		if err != nil {
			return nil, err
		}
		popts.Simulated, popts.Sim = true, simOptions(facts, meta, c)
		if probe.SimProbeMode(c.Env) != "" {
			// A fixture asking to be emulated, or to misbehave on purpose.
			kind = probe.Sim
		}
	}
	if kind == probe.Exec {
		argvLabel := meta.ProbeExec
		if argvLabel == "" {
			c, err := config()
			if err != nil {
				return nil, err
			}
			argvLabel = c.Labels[images.AnnotationProbeExec]
		}
		if argvLabel != "" {
			if popts.ExecArgv, err = probe.ParseExecLabel(argvLabel); err != nil {
				return nil, err
			}
		}
	}
	prog, err := probe.Build(kind, popts)
	if err != nil {
		return nil, err
	}
	gpus := containerd.DefaultGPUs(facts.Simulated)
	if p.opts.GPUs != nil {
		gpus = *p.opts.GPUs
	}
	return &probeRun{kind: kind, prog: prog, gpus: gpus}, nil
}

// simOptions tell a probe in its simulated mode about the node it stands
// in for: its GPUs, its driver's CUDA, and the CUDA the variant targets.
func simOptions(facts *node.Facts, meta images.Metadata, cfg *ocispec.ImageConfig) probe.SimOptions {
	var sim probe.SimOptions
	for _, g := range facts.GPUs {
		sim.Devices = append(sim.Devices, probe.Device{Index: g.Index, UUID: g.UUID, Name: g.Name, CC: g.CC})
	}
	sim.NodeCUDA = facts.CUDA
	sim.VariantCUDA = variantCUDA(meta, cfg)
	return sim
}

func (r *probeRun) mounts() []containerd.Mount {
	var out []containerd.Mount
	for _, m := range r.prog.Mounts {
		out = append(out, containerd.Mount{Source: m.Source, Destination: m.Destination})
	}
	return out
}

// runFailed says why a probe container did not run to its end: killed at
// its timeout, a program that could not start in the image, or the
// runtime's own error.
func (r *probeRun) runFailed(output []byte, err error, timeout time.Duration) error {
	if errors.Is(err, containerd.ErrTimeout) {
		return probe.NewFailure(fmt.Sprintf("%s probe did not finish in %s and was killed", r.kind, timeout), output)
	}
	if reason := probe.Explain(r.prog, output, err); reason != "" {
		return probe.NewFailure(reason, output)
	}
	return fmt.Errorf("%s probe: %w", r.kind, err)
}

// judge reads the verdict of a probe that ran, and holds it to what a pin
// will claim: no simulated checks on a node with GPUs, every GPU of the
// node covered, and on a simulated node a verdict that says it is so.
func (r *probeRun) judge(output []byte, exitCode int, facts *node.Facts) (*probe.Verdict, error) {
	v, err := probe.Parse(output, exitCode)
	if err != nil {
		if v == nil {
			// No verdict: a program that could not start says why here.
			if reason := probe.Explain(r.prog, output, nil); reason != "" {
				return nil, probe.NewFailure(reason, output)
			}
		}
		return nil, err
	}
	if !facts.Simulated && len(v.SimulatedChecks) > 0 {
		// A verdict that skipped checks proves nothing on a node with GPUs.
		return nil, probe.NewFailure(fmt.Sprintf("the probe simulated checks on a node with GPUs (%s); its verdict proves nothing here",
			strings.Join(v.SimulatedChecks, "; ")), output)
	}
	if allGPUs(r.gpus) {
		// The pin will say "proved on these GPUs": every one of them.
		missing, err := uncovered(r.kind, facts.GPUs, v.Devices)
		if err != nil {
			return nil, probe.NewFailure(err.Error(), output)
		}
		if len(missing) > 0 {
			return nil, probe.NewFailure(fmt.Sprintf("the probe did not compute on all of the node's %d GPUs; missing %s (%s)",
				len(facts.GPUs), strings.Join(missing, ", "), r.coverageHint(facts)), output)
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
	v.Runtime["probe"] = string(r.kind)
	v.Simulated = facts.Simulated
	return v, nil
}

// coverageHint is where to look when a verdict misses GPUs. On a simulated
// node no device is visible at all: a probe reports the devices gpupin
// hands it in GPUPIN_SIM_DEVICES (docs/probe-protocol.md).
func (r *probeRun) coverageHint(facts *node.Facts) string {
	if facts.Simulated {
		return fmt.Sprintf("on a simulated node the %s probe must report the devices of $%s as its own", r.kind, probe.EnvSimDevices)
	}
	return "is CUDA_VISIBLE_DEVICES set in the image, or the CDI spec stale?"
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
func allGPUs(g containerd.GPUs) bool {
	switch g.Mode {
	case containerd.GPUCDI:
		return len(g.Devices) == 1 && g.Devices[0] == containerd.DefaultCDIDevice
	case containerd.GPUNvidiaRuntime:
		return len(g.Devices) == 0 || (len(g.Devices) == 1 && g.Devices[0] == "all")
	case containerd.GPUNone:
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
