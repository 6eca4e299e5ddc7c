package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
)

// NamedByPin: the key is a pin's own, as the provision that made it named it.
const NamedByPin = "pin"

// ErrNotPulled: the image to probe is not in containerd's namespace.
var ErrNotPulled = errors.New("image not pulled")

// Named is a reference as a provision reads and names it: its variants,
// and the key it would pin under.
type Named struct {
	Set     *images.Set
	Engine  string
	Version string
	Key     string
	NamedBy string
}

// Name resolves w's reference and names its engine and version exactly as
// Plan and Provision do (the want's, else the image's metadata, else the
// repository's last element and the tag). Nothing is pulled.
func (p *Provisioner) Name(ctx context.Context, in Want) (*Named, error) {
	w, err := readWant(in)
	if err != nil {
		return nil, err
	}
	set, err := p.opts.Resolver.ResolveReference(ctx, w.parsedRef)
	if err != nil {
		return nil, err
	}
	var pl Plan
	pl.name(w, set)
	return &Named{Set: set, Engine: pl.Engine, Version: pl.Version, Key: pl.Key, NamedBy: pl.NamedBy}, nil
}

// CheckOverride checks an override of engine against the image it is
// meant for, before it is filed: ref must be that engine as a provision
// names it (Name), and a variant override must be one ref publishes. A
// mismatch is ErrInvalidWant; a registry that does not answer, its own
// error.
func (p *Provisioner) CheckOverride(ctx context.Context, engine string, ov images.Override, ref string) error {
	named, err := p.Name(ctx, Want{Ref: ref})
	if err != nil {
		return err
	}
	if named.Engine != engine {
		return newOutcome(ErrInvalidWant, nil, "%s is engine %s (named by its %s), not %s", ref, named.Engine, namedByWords(named.NamedBy), engine)
	}
	if ov.Kind != images.OverrideVariant {
		return nil
	}
	var published []string
	for _, v := range named.Set.Variants {
		if !slices.Contains(published, v.Variant) {
			published = append(published, v.Variant)
		}
	}
	if !slices.Contains(published, ov.Variant) {
		slices.Sort(published)
		return newOutcome(ErrInvalidWant, nil, "variant %s is not published under %s; published: %s", ov.Variant, ref, strings.Join(published, ", "))
	}
	return nil
}

// namedByWords says how a key was named, as a person reads it.
func namedByWords(by string) string {
	switch by {
	case NamedByMetadata:
		return "io.gpupin.engine metadata"
	case NamedByPin:
		return "pin"
	case NamedByWant:
		return "want"
	}
	return "repository's last element"
}

// ProbeTarget is an image as a provision would probe it: the engine it is
// named, the variant metadata it was chosen with, and so the probe that
// proves it. `gpupin probe` prints it and hands it to Probe.
type ProbeTarget struct {
	// Image is the image record the probe runs in.
	Image   string `json:"image"`
	Engine  string `json:"engine"`
	Key     string `json:"key"`
	NamedBy string `json:"named_by"`
	Variant string `json:"variant,omitempty"`
	// Probe is the probe the metadata and engine select. On a simulated
	// node an image that asks to be emulated (GPUPIN_SIM_PROBE) gets the
	// emulator instead; the verdict's runtime.probe says which ran.
	Probe probe.Kind      `json:"probe"`
	Meta  images.Metadata `json:"metadata"`
	// From says where the metadata came from: the reference in the
	// registry, the source a pin was made from, or, when the registry did
	// not answer, the image's own config in containerd.
	From string      `json:"from"`
	Node *node.Facts `json:"-"`
}

// ProbeAs is what the caller says in place of the image's own metadata.
type ProbeAs struct {
	// Engine names the engine (the probe's default, the torch probe's import).
	Engine string
	// Probe is the probe kind to run, over the image's io.gpupin.probe.
	Probe string
}

// ProbeTarget reads an image already in containerd (a tag, a digest, a pin
// or its local name) as a provision reads it, so that a probe of it alone
// runs the probe a provision would: its metadata comes from the registry
// through the same resolver, its engine is named by the same rule, and a
// pin's comes from the source it was made from, whose index entry may be
// the only place its io.gpupin.probe is written. When the registry does not
// answer, the image's own config (labels, CUDA_VERSION) stands in, as it
// does for an image without annotations, and From says so.
func (p *Provisioner) ProbeTarget(ctx context.Context, image string, as ProbeAs) (*ProbeTarget, error) {
	w, err := readWant(Want{Ref: image, Engine: as.Engine})
	if err != nil {
		return nil, err
	}
	// The probe runs in the image as containerd holds it: without
	// containerd that is the answer, whatever the node says.
	if p.none {
		return nil, fmt.Errorf("probe target: %w to find the image in", errNoRuntime)
	}
	facts, err := p.opts.Node.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read node facts: %w", err)
	}
	if !facts.Simulated && !facts.Supported() {
		return nil, newOutcome(ErrUnsupported, nil, "unsupported: %s", facts.Unsupported)
	}
	cfg, err := p.rt.ImageConfig(ctx, image, facts.Platform)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("%w: %w", ErrNotPulled, err)
		}
		return nil, err
	}
	pins, err := p.rt.Pins(ctx)
	if err != nil {
		return nil, err
	}
	t := &ProbeTarget{Image: image, Node: facts}
	pin := pinNamed(pins, image)
	if pin == nil || !p.fromPin(ctx, t, pin, as) {
		p.fromReference(ctx, t, w, pin, cfg)
	}
	if as.Probe != "" {
		if _, err := probe.Select(as.Probe, "", ""); err != nil {
			return nil, fmt.Errorf("%w: probe: %v", ErrInvalidWant, err)
		}
		t.Meta.Probe = as.Probe
	}
	if t.Probe, err = p.probeKind(t.Meta, t.Engine); err != nil {
		return nil, err
	}
	return t, nil
}

// fromReference fills t from the image's reference in the registry, as
// Plan reads it; when the registry does not answer (or holds another
// image under the name now), from the image's own config, read as an
// image without annotations is read. A pin's key and probe stand where
// nothing else names them.
func (p *Provisioner) fromReference(ctx context.Context, t *ProbeTarget, w want, pin *containerd.Pin, cfg ocispec.ImageConfig) {
	set, rerr := p.opts.Resolver.ResolveReference(ctx, w.parsedRef)
	var v *images.Variant
	if rerr == nil {
		v = variantOn(set, t.Node.Platform)
	}
	if v == nil {
		md, _, derr := images.DeriveMetadata(cfg.Env, cfg.Labels)
		if derr != nil {
			md = images.Metadata{Engine: cfg.Labels[images.AnnotationEngine], EngineVersion: cfg.Labels[images.AnnotationEngineVersion],
				Probe: cfg.Labels[images.AnnotationProbe], ProbeExec: cfg.Labels[images.AnnotationProbeExec]}
		}
		v = &images.Variant{Metadata: md}
		set = &images.Set{Variants: []images.Variant{*v}}
		t.From = "the image's own config in containerd"
		if rerr != nil {
			t.From += fmt.Sprintf(" (the registry did not answer: %v)", rerr)
		}
	} else {
		t.From = "the registry: " + t.Image
	}
	var pl Plan
	pl.name(w, set)
	t.Engine, t.Key, t.NamedBy = pl.Engine, pl.Key, pl.NamedBy
	if pin != nil && w.Engine == "" {
		t.Key, t.NamedBy = pin.Key, NamedByPin
		t.Engine, _, _ = strings.Cut(pin.Key, ":")
	}
	if v.Probe == "" && pin != nil && pin.Probe != string(probe.Sim) {
		// The probe that proved the pin, when nothing else names one.
		v.Probe = pin.Probe
	}
	t.Meta, t.Variant = v.Metadata, v.Variant
}

// fromPin fills t from the index entry a pin was chosen from: its source,
// or the image an override put in its place. It reports whether the entry
// was found there.
func (p *Provisioner) fromPin(ctx context.Context, t *ProbeTarget, pin *containerd.Pin, as ProbeAs) bool {
	sources := []string{pin.Source}
	if ov, err := images.ParseOverride(pin.Override); err == nil && ov.Kind == images.OverrideImage {
		sources = append(sources, ov.Image)
	}
	for _, src := range sources {
		set, err := p.resolve(ctx, src)
		if err != nil {
			continue
		}
		for _, v := range set.Variants {
			if v.Digest != pin.Digest || v.Invalid != "" {
				continue
			}
			t.Key, t.NamedBy = pin.Key, NamedByPin
			t.Engine, _, _ = strings.Cut(pin.Key, ":")
			if as.Engine != "" {
				t.Engine, t.NamedBy = as.Engine, NamedByWant
			}
			t.Meta, t.Variant = v.Metadata, v.Variant
			t.From = "the registry: " + src + ", the source of pin " + pin.Key
			return true
		}
	}
	return false
}

// probeKind is the probe a provision runs for a variant of engine (the
// selection Probe makes): the variant's io.gpupin.probe, else the engine
// family's, else the default probe.
func (p *Provisioner) probeKind(meta images.Metadata, engine string) (probe.Kind, error) {
	return probeKindOf(meta, engine, p.opts.DefaultProbe)
}

func probeKindOf(meta images.Metadata, engine, defaultProbe string) (probe.Kind, error) {
	return probe.Select(meta.Probe, probe.EngineFamily(engine), defaultProbe)
}

// pinNamed is the pin an image name is: its digested reference or its
// node-local name.
func pinNamed(pins []containerd.Pin, name string) *containerd.Pin {
	for i := range pins {
		if pins[i].Tampered {
			continue
		}
		if pins[i].Ref == name || (pins[i].Local != "" && pins[i].Local == name) {
			return &pins[i]
		}
	}
	return nil
}

// variantOn is the variant containerd runs from a record of the set on a
// platform: the first valid entry for it (a single image is its own).
func variantOn(set *images.Set, platform string) *images.Variant {
	for i, v := range set.Variants {
		if v.Invalid == "" && images.PlatformMatches(v.Platform, platform) {
			return &set.Variants[i]
		}
	}
	return nil
}
