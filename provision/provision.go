package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/singleflight"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/runtime"
)

// Runtime is what provisioning needs of containerd.
type Runtime interface {
	Pins(ctx context.Context) ([]runtime.Pin, error)
	SetPin(ctx context.Context, p runtime.Pin) error
	WithLease(ctx context.Context, fn func(ctx context.Context) error) error
	Pull(ctx context.Context, ref string, opts runtime.PullOptions) (runtime.Pulled, error)
	ImageConfig(ctx context.Context, name, platform string) (ocispec.ImageConfig, error)
	Run(ctx context.Context, spec runtime.RunSpec) (runtime.RunResult, error)
	DiscardCandidate(ctx context.Context, name string) error
}

// Resolver reads a reference down to its variants.
type Resolver interface {
	Resolve(ctx context.Context, ref string) (*images.Set, error)
}

// Options tune provisioning.
type Options struct {
	ProbeTimeout time.Duration // default 10m
	ProbeMemory  uint64        // bytes, default 16 GiB: torch and an engine import are large
	ProbePids    int64         // default 4096
	// GPUs for the probe container; default CDI, all GPUs (none on a simulated node).
	GPUs *runtime.GPUs
	// ProbeDir is where probe programs are staged on the host.
	ProbeDir        string
	CUDAProbeBinary string
	// DefaultProbe is --probe: used when neither annotation nor engine decides.
	DefaultProbe string
	// Progress receives pull progress.
	Progress func(key string, p runtime.Progress)
	// LockDir holds the per-engine file locks that keep two processes from
	// provisioning one engine at once; "" means no cross-process lock.
	LockDir string
	// OverrideFor gives the operator's override of an engine when a want
	// names none (the overrides file).
	OverrideFor func(engine string) (images.Override, bool)
	// OnState sees every state change of every provision.
	OnState func(Status)
	Logger  *slog.Logger
	Now     func() time.Time
}

// Provisioner provisions wants on one node.
type Provisioner struct {
	rt       Runtime
	resolver Resolver
	node     node.Reader
	opts     Options
	flight   singleflight.Group
}

// New makes a Provisioner.
func New(rt Runtime, resolver Resolver, nodes node.Reader, opts Options) *Provisioner {
	if opts.ProbeTimeout == 0 {
		opts.ProbeTimeout = 10 * time.Minute
	}
	if opts.ProbeMemory == 0 {
		opts.ProbeMemory = 16 << 30
	}
	if opts.ProbePids == 0 {
		opts.ProbePids = 4096
	}
	if opts.ProbeDir == "" {
		opts.ProbeDir = filepath.Join(os.TempDir(), "gpupin-probe")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Provisioner{rt: rt, resolver: resolver, node: nodes, opts: opts}
}

// Provision brings one want to a pinned, proved image, or says why not.
// Two calls for the same engine at once share one piece of work.
func (p *Provisioner) Provision(ctx context.Context, w Want) Status {
	for {
		v, _, shared := p.flight.Do(w.Key()+"\x00"+w.Override, func() (any, error) {
			st := p.provision(ctx, w)
			st.Cancelled = ctx.Err() != nil
			return st, nil
		})
		st := v.(Status)
		if st.Cancelled && shared && ctx.Err() == nil {
			// Joined a flight whose own caller gave up: that is no answer
			// to this caller, who still wants one.
			continue
		}
		return st
	}
}

// Converge provisions every want, two at a time, and returns their
// statuses in the order of wants.
func (p *Provisioner) Converge(ctx context.Context, wants []Want) []Status {
	out := make([]Status, len(wants))
	sem := make(chan struct{}, 2)
	done := make(chan struct{})
	for i, w := range wants {
		go func() {
			sem <- struct{}{}
			out[i] = p.Provision(ctx, w)
			<-sem
			done <- struct{}{}
		}()
	}
	for range wants {
		<-done
	}
	return out
}

func (p *Provisioner) provision(ctx context.Context, w Want) (st Status) {
	start := p.opts.Now()
	st = Status{Key: w.Key(), Engine: w.Engine, Version: w.Version, Ref: w.Ref, State: Pending}
	defer func() {
		st.Duration = p.opts.Now().Sub(start)
		st.At = p.opts.Now()
		p.emit(st)
	}()
	ov, err := images.ParseOverride(w.Override)
	if err != nil {
		return st.fail("%v", err)
	}
	guess := w.Engine
	if guess == "" {
		if r, err := images.ParseReference(w.Ref, nil); err == nil {
			guess = images.EngineFromRepo(r)
		}
	}
	fromFile := w.Override == "" && p.opts.OverrideFor != nil
	if fromFile {
		if o, ok := p.opts.OverrideFor(guess); ok {
			ov = o
		}
	}
	st.Override = ov.String()
	if st.Engine == "" {
		// Provisional names until the image's metadata says better.
		st.Engine = guess
	}
	if st.Version == "" {
		if r, err := images.ParseReference(w.Ref, nil); err == nil && !strings.HasPrefix(r.Identifier(), "sha256:") {
			st.Version = r.Identifier()
		}
	}
	if st.Engine != "" && st.Version != "" {
		st.Key = st.Engine + ":" + st.Version
	}
	unlock, err := lockEngine(ctx, p.opts.LockDir, guess)
	if err != nil {
		return st.fail("%v", err)
	}
	defer unlock()
	facts, err := p.node.Read(ctx)
	if err != nil {
		return st.fail("read node facts: %v", err)
	}
	st.Simulated = facts.Simulated
	if !facts.Supported() {
		st.State, st.Detail = Unsupported, "unsupported: "+facts.Unsupported
		return st
	}
	if ov.Kind == images.OverrideNone {
		st.State, st.Detail = Disabled, "override is none: this node does not run this engine (its pin, if any, is kept until gc)"
		return st
	}

	// Installed wins: a pin proved on these very GPUs and driver is used as
	// it is, without the registry, so a registry outage cannot stop a node
	// that was already provisioned.
	pins, err := p.rt.Pins(ctx)
	if err != nil {
		return st.fail("%v", err)
	}
	if pin := matchPin(pins, w, ov); holds(pin, facts) {
		return st.ready(*pin, true, "pinned "+pin.Ref+" (proved "+pin.ProbedAt.Format(time.RFC3339)+" on this node)")
	}

	source := w.Ref
	if ov.Kind == images.OverrideImage {
		source = ov.Image
	}
	set, err := p.resolver.Resolve(ctx, source)
	if err != nil {
		return st.fail("%v", err)
	}
	p.name(&st, w, set)
	if fromFile && st.Engine != guess {
		// The image named its engine: the operator's override is filed under that name.
		if o, ok := p.opts.OverrideFor(st.Engine); ok && o != ov {
			ov = o
			st.Override = ov.String()
			if ov.Kind == images.OverrideNone {
				st.State, st.Detail = Disabled, "override is none: this node does not run this engine (its pin, if any, is kept until gc)"
				return st
			}
			if ov.Kind == images.OverrideImage {
				if set, err = p.resolver.Resolve(ctx, ov.Image); err != nil {
					return st.fail("%v", err)
				}
			}
		}
	}
	// The want may have named only a reference: now that the key is known,
	// a pin under it may answer after all.
	if pin := matchPin(pins, Want{Engine: st.Engine, Version: st.Version, Ref: w.Ref}, ov); holds(pin, facts) {
		return st.ready(*pin, true, "pinned "+pin.Ref+" (proved on this node)")
	}

	choice := ov
	if ov.Kind == images.OverrideImage {
		// The operator's image still has to suit the node, and is still probed.
		choice = images.Override{Kind: images.OverrideAuto}
	}
	plan := images.Choose(facts, set, choice)
	st.Rejected = plan.Rejected
	switch plan.Outcome {
	case images.OutcomeUnsupported:
		st.State, st.Detail = Unsupported, plan.Detail
		return st
	case images.OutcomeNoCandidate:
		var reasons []string
		for _, r := range plan.Rejected {
			reasons = append(reasons, r.Reason)
		}
		if len(reasons) > 0 {
			return st.fail("%s: %s", plan.Detail, strings.Join(reasons, "; "))
		}
		return st.fail("%s", plan.Detail)
	}

	if old := pinOf(pins, st.Key); facts.Simulated && old != nil && !old.Simulated {
		// Decided before any pull: every pass would end the same way.
		return st.fail("a simulated probe never replaces %s, which was proved on hardware; use a namespace of its own for simulated runs", old.Ref)
	}
	for _, c := range plan.Candidates {
		pin, verdict, attempt := p.try(ctx, &st, c, w, ov, facts)
		if attempt == nil {
			st.Verdict = verdict
			msg := fmt.Sprintf("pinned %s (%s), probe passed", pin.Ref, c.Variant)
			if len(st.Attempts) > 0 {
				msg += " after " + attemptsSummary(st.Attempts)
			}
			return st.ready(pin, false, msg)
		}
		st.Attempts = append(st.Attempts, *attempt)
		p.opts.Logger.Warn("candidate failed", "key", st.Key, "variant", c.Variant, "stage", attempt.Stage, "reason", firstLine(attempt.Reason))
		if ctx.Err() != nil || ov.Kind != images.OverrideAuto {
			break // a forced variant or image gets no fallback
		}
	}
	detail := attemptsSummary(st.Attempts)
	if len(plan.Candidates) > 1 {
		detail = fmt.Sprintf("all %d candidates failed: %s", len(st.Attempts), detail)
	}
	st = st.fail("%s", detail)
	if old := pinOf(pins, st.Key); old != nil {
		st.Detail += "; the earlier pin " + old.Ref + " is unchanged"
		if holds(old, facts) {
			// Still proved on this node as it is: replicas may keep starting from it.
			st.Pin, st.Pinned = old, old.Ref
		}
	}
	return st
}

// try pulls, probes and pins one candidate under a lease.
func (p *Provisioner) try(ctx context.Context, st *Status, c images.Candidate, w Want, ov images.Override, facts *node.Facts) (runtime.Pin, *probe.Verdict, *Attempt) {
	var (
		pin     runtime.Pin
		verdict *probe.Verdict
		attempt *Attempt
	)
	err := p.rt.WithLease(ctx, func(ctx context.Context) error {
		st.State, st.Variant, st.Detail = Pulling, c.Variant, "pulling "+c.Ref
		p.emit(*st)
		pulled, err := p.rt.Pull(ctx, c.Ref, runtime.PullOptions{Platform: facts.Platform, Progress: func(pr runtime.Progress) {
			if p.opts.Progress != nil {
				p.opts.Progress(st.Key, pr)
			}
		}})
		if err != nil {
			attempt = &Attempt{Variant: c.Variant, Ref: c.Ref, Stage: "pull", Reason: err.Error()}
			return nil
		}
		st.State, st.Detail = Probing, "probing "+pulled.Name
		p.emit(*st)
		v, out, err := p.Probe(ctx, pulled.Name, c.Meta, st.Engine, facts)
		if err != nil {
			attempt = &Attempt{Variant: c.Variant, Ref: c.Ref, Stage: "probe", Reason: err.Error(), Output: out}
			if pulled.Created {
				p.rt.DiscardCandidate(context.WithoutCancel(ctx), pulled.Name)
			}
			return nil
		}
		verdict = v
		st.ProbeOutput = out
		pin = runtime.Pin{
			Key: st.Key, Ref: pulled.Name, Digest: pulled.Digest, Variant: c.Variant, Source: w.Ref,
			Override: ov.String(), Node: facts.Fingerprint(), ProbedAt: p.opts.Now(),
			Probe: compactVerdict(v), Simulated: facts.Simulated,
		}
		// The pin is one update plus a demotion: once begun it is
		// finished, whatever happens to the caller meanwhile.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err = p.rt.SetPin(pctx, pin)
		cancel()
		if err != nil {
			attempt = &Attempt{Variant: c.Variant, Ref: c.Ref, Stage: "pin", Reason: err.Error()}
		}
		if attempt != nil && pulled.Created {
			p.rt.DiscardCandidate(context.WithoutCancel(ctx), pulled.Name)
		}
		return nil
	})
	if err != nil && attempt == nil {
		attempt = &Attempt{Variant: c.Variant, Ref: c.Ref, Stage: "lease", Reason: err.Error()}
	}
	return pin, verdict, attempt
}

// Probe runs an image's probe in a container of that image (already
// pulled, as the record named image), with the same box and checks a
// provision uses, and pins nothing. It returns the verdict and the tail of
// the probe's output. `gpupin probe` calls it alone.
func (p *Provisioner) Probe(ctx context.Context, image string, meta images.Metadata, engine string, facts *node.Facts) (*probe.Verdict, string, error) {
	if !facts.Simulated && !facts.Supported() {
		return nil, "", fmt.Errorf("unsupported: %s", facts.Unsupported)
	}
	engine = probe.EngineFamily(engine)
	kind, err := probe.Select(meta.Probe, engine, p.opts.DefaultProbe)
	if err != nil {
		return nil, "", err
	}
	gpus := runtime.GPUs{Mode: runtime.GPUCDI, Devices: []string{runtime.DefaultCDIDevice}}
	popts := probe.Options{Dir: p.opts.ProbeDir, CUDAProbeBinary: p.opts.CUDAProbeBinary, Engine: engine}
	if facts.Simulated {
		// No GPU to prove on: the simulated probe emulates the verdict a
		// real one would give for these facts, in the real container.
		kind = probe.Sim
		gpus = runtime.GPUs{Mode: runtime.GPUNone}
		for _, g := range facts.GPUs {
			popts.Sim.Devices = append(popts.Sim.Devices, probe.Device{Index: g.Index, UUID: g.UUID, Name: g.Name, CC: g.CC})
		}
		popts.Sim.NodeCUDA = facts.CUDA
	}
	if p.opts.GPUs != nil {
		gpus = *p.opts.GPUs
	}
	if kind == probe.Exec {
		argvLabel := meta.ProbeExec
		if argvLabel == "" {
			cfg, err := p.rt.ImageConfig(ctx, image, facts.Platform)
			if err != nil {
				return nil, "", err
			}
			argvLabel = cfg.Labels[images.AnnotationProbeExec]
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
		return nil, probe.Tail(res.Output), fmt.Errorf("%s probe: %w", kind, err)
	}
	v, err := probe.Parse(res.Output, res.ExitCode)
	if err != nil {
		return nil, probe.Tail(res.Output), err
	}
	if allGPUs(gpus) {
		// The pin will say "proved on these GPUs": every one of them.
		if missing := uncovered(facts.GPUs, v.Devices); len(missing) > 0 {
			f := probe.NewFailure(fmt.Sprintf("the probe did not compute on all of the node's %d GPUs; missing %s (is CUDA_VISIBLE_DEVICES set in the image, or the CDI spec stale?)",
				len(facts.GPUs), strings.Join(missing, ", ")), res.Output)
			return nil, f.Tail, f
		}
	}
	v.Simulated = facts.Simulated
	return v, probe.Tail(res.Output), nil
}

func (p *Provisioner) name(st *Status, w Want, set *images.Set) {
	// The image's own metadata names it better than its repository and tag.
	for _, v := range set.Variants {
		if w.Engine == "" && v.Engine != "" {
			st.Engine = v.Engine
		}
		if w.Version == "" && v.EngineVersion != "" {
			st.Version = v.EngineVersion
		}
	}
	if st.Engine == "" || st.Version == "" {
		if ref, err := images.ParseReference(w.Ref, nil); err == nil {
			if st.Engine == "" {
				st.Engine = images.EngineFromRepo(ref)
			}
			if st.Version == "" {
				st.Version = ref.Identifier()
				if strings.HasPrefix(st.Version, "sha256:") {
					st.Version = st.Version[:19]
				}
			}
		}
	}
	st.Key = st.Engine + ":" + st.Version
}

// matchPin finds the pin a want already has: by engine:version when known,
// else by the reference it was provisioned from; the override must match
// too, since a pin made under another override answers another question.
func matchPin(pins []runtime.Pin, w Want, ov images.Override) *runtime.Pin {
	for i := range pins {
		pin := &pins[i]
		if pin.Override != ov.String() {
			continue
		}
		if w.Engine != "" && w.Version != "" {
			if pin.Key == w.Key() && pin.Source == w.Ref {
				return pin
			}
			continue
		}
		if pin.Source == w.Ref {
			return pin
		}
	}
	return nil
}

// holds reports whether a pin was proved on this node as it is now: the
// same driver and GPUs, and proved the same way — a pin made by the
// simulated probe never stands for a proof on hardware, nor the reverse.
func holds(pin *runtime.Pin, facts *node.Facts) bool {
	return pin != nil && pin.Node == facts.Fingerprint() && pin.Simulated == facts.Simulated
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
// matched by UUID; a verdict whose devices carry no UUIDs (an image's own
// self-test may not print them) is held to the count instead. Under MIG the
// probe sees instances, not GPUs: there it must have seen at least as many
// devices as the node has GPUs.
func uncovered(gpus []node.GPU, devs []probe.Device) []string {
	seen := map[string]bool{}
	withUUID := 0
	for _, d := range devs {
		if d.UUID != "" {
			seen[strings.ToLower(d.UUID)] = true
			withUUID++
		}
	}
	mig := false
	for _, g := range gpus {
		mig = mig || g.MIG == "enabled"
	}
	if mig || withUUID < len(devs) || withUUID == 0 {
		if len(devs) >= len(gpus) {
			return nil
		}
		return []string{fmt.Sprintf("%d of them (it reported %d devices)", len(gpus)-len(devs), len(devs))}
	}
	var missing []string
	for _, g := range gpus {
		if !seen[strings.ToLower(g.UUID)] {
			missing = append(missing, fmt.Sprintf("GPU %d (%s, %s)", g.Index, g.Name, g.UUID))
		}
	}
	return missing
}

func pinOf(pins []runtime.Pin, key string) *runtime.Pin {
	for i := range pins {
		if pins[i].Key == key {
			return &pins[i]
		}
	}
	return nil
}

func (p *Provisioner) emit(st Status) {
	if p.opts.OnState != nil {
		p.opts.OnState(st)
	}
}

func (st Status) fail(format string, args ...any) Status {
	st.State = Failed
	st.Detail = fmt.Sprintf(format, args...)
	return st
}

func (st Status) ready(pin runtime.Pin, fromPin bool, detail string) Status {
	st.State, st.Detail, st.FromPin = Ready, detail, fromPin
	st.Pin, st.Pinned, st.Variant = &pin, pin.Ref, pin.Variant
	if st.Engine == "" || st.Version == "" {
		if e, v, ok := strings.Cut(pin.Key, ":"); ok {
			st.Engine, st.Version = e, v
		}
	}
	st.Key = pin.Key
	return st
}

// compactVerdict is the verdict as the pin's label keeps it: small.
func compactVerdict(v *probe.Verdict) string {
	type dev struct {
		Index  int     `json:"i"`
		CC     string  `json:"cc"`
		TFLOPS float64 `json:"tflops"`
	}
	c := struct {
		OK        bool  `json:"ok"`
		Devices   []dev `json:"devices"`
		Simulated bool  `json:"simulated,omitempty"`
	}{OK: v.OK, Simulated: v.Simulated}
	for _, d := range v.Devices {
		c.Devices = append(c.Devices, dev{d.Index, d.CC, d.TFLOPS})
	}
	b, _ := json.Marshal(c)
	return string(b)
}
