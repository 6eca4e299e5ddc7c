package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	cimages "github.com/containerd/containerd/v2/core/images"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// reads is what a decision for one want is made on, each part read once:
// the node, the pins, the operator's overrides of the engines involved,
// and the registry's answer for the want's reference and for an
// override's image. decide takes it as values and calls nothing.
type reads struct {
	facts *node.Facts
	pins  []containerd.Pin
	// overrides is the operator's override per engine read so far: those
	// of the pins from the want's source, and the plan's engine.
	overrides map[string]applied
	// set is the want's reference resolved; nil until decide asks for it,
	// and never read when a pin answers, or when the want names its key
	// and an image of its own.
	set *images.Set
	// image is an override's image resolved; nil until decide asks.
	image *images.Set
}

// applied is an override and where it came from (OverrideFrom*).
type applied struct {
	override images.Override
	from     string
}

// need is what decide asks to be read before it can decide: the shape of
// kubelet's shouldPullImage, with the reads it needs named rather than
// made, so that what is read is exactly what the decision uses.
type need struct {
	kind   needKind
	engine string // needOverride: whose
	ref    string // needImage: the override's image
}

type needKind int

const (
	needNothing  needKind = iota
	needSet               // the want's reference, down to its variants
	needOverride          // the operator's override of engine
	needImage             // an override's image, down to its variants
)

// decide is the plan for w on what r holds, or what must be read first.
// Its order is the plan's: the node, a pin that answers, the key, the
// override, the key's holder, then the choice among the variants.
func decide(w want, r *reads, defaultProbe string) (*Plan, need, error) {
	pl := &Plan{Ref: w.Ref, Source: w.Ref, Node: r.facts, Simulated: r.facts.Simulated,
		Candidates: []images.Candidate{}, Rejected: []images.Rejection{}}
	pl.name(w, nil)
	if !r.facts.Supported() {
		pl.Outcome, pl.Detail = OutcomeUnsupported, "unsupported: "+r.facts.Unsupported
		pl.Err = newOutcome(ErrUnsupported, nil, "%s", pl.Detail)
		return pl, need{}, nil
	}
	// Installed wins: a pin proved on these very GPUs and driver answers
	// without the registry, so an outage cannot stop a provisioned node.
	pin, n := pinFor(w, r)
	if n.kind != needNothing {
		return nil, n, nil
	}
	if pin != nil {
		pl.answeredBy(pin)
		return pl, need{}, nil
	}
	// A want that names its key and an image override needs nothing of
	// its own reference.
	if r.set == nil && !(w.namesKey() && w.ownOverride.Kind == images.OverrideImage) {
		return nil, need{kind: needSet}, nil
	}
	pl.name(w, r.set)
	if err := validKey(pl.Engine, pl.Version); err != nil {
		return nil, need{}, err
	}
	ov, ok := r.overrideFor(w, pl.Engine)
	if !ok {
		return nil, need{kind: needOverride, engine: pl.Engine}, nil
	}
	pl.override, pl.Override, pl.OverrideFrom = ov.override, ov.override.String(), ov.from
	pl.Held = pinOf(r.pins, pl.Key)
	if pl.override.Kind == images.OverrideNone {
		pl.Outcome, pl.Detail = OutcomeNone, "override is none: this node does not run this engine (its pin, if any, is kept until gc)"
		pl.Err = newOutcome(ErrDisabled, nil, "%s", pl.Detail)
		return pl, need{}, nil
	}
	if err := checkHeld(pl, w, r.pins, r.facts); err != nil {
		pl.Outcome, pl.Detail, pl.Err = OutcomeConflict, err.Error(), err
		errors.As(err, &pl.Conflict)
		return pl, need{}, nil
	}
	// An operator's image replaces the engine's variants: they are chosen
	// among by the same rules, and still probed.
	set, choice := r.set, pl.override
	if choice.Kind == images.OverrideImage {
		if r.image == nil {
			return nil, need{kind: needImage, ref: choice.Image}, nil
		}
		pl.Source, set, choice = choice.Image, r.image, images.Override{Kind: images.OverrideAuto}
	}
	if err := pl.choose(set, choice, defaultProbe); err != nil {
		return nil, need{}, err
	}
	return pl, need{}, nil
}

// overrideFor is the override that applies to engine for w: its own,
// else the operator's as read, else auto as read; false when the
// operator's has not been read yet.
func (r *reads) overrideFor(w want, engine string) (applied, bool) {
	if w.ownOverride.Kind != "" {
		return applied{w.ownOverride, OverrideFromWant}, true
	}
	a, ok := r.overrides[engine]
	return a, ok
}

// pinFor is the pin that answers w as it is: made from w's reference
// (under w's key when the want names one), under the override that applies
// to its engine now, and proved on this node as it is.
func pinFor(w want, r *reads) (*containerd.Pin, need) {
	for i := range r.pins {
		pin := &r.pins[i]
		if pin.Source != w.Ref || pin.Tampered {
			continue
		}
		if w.namesKey() && pin.Key != w.Key() {
			continue
		}
		engine, _, _ := strings.Cut(pin.Key, ":")
		ov, ok := r.overrideFor(w, engine)
		if !ok {
			return nil, need{kind: needOverride, engine: engine}
		}
		if ov.override.Kind == images.OverrideNone || pin.Override != ov.override.String() {
			continue
		}
		if holds(pin, r.facts) {
			return pin, need{}
		}
	}
	return nil, need{}
}

// answeredBy makes the plan the pin's: its key and override, and nothing
// to do.
func (pl *Plan) answeredBy(pin *containerd.Pin) {
	pl.Pinned, pl.Held = pin, pin
	pl.Key, pl.Override, pl.OverrideFrom = pin.Key, pin.Override, "pin"
	pl.Engine, pl.Version, _ = strings.Cut(pin.Key, ":")
	pl.Outcome = OutcomePinned
	pl.Detail = fmt.Sprintf("pinned %s (%s), proved %s on this node", pin.Ref, pin.Variant, pin.ProbedAt.Format(time.RFC3339))
}

// checkHeld refuses what must not replace the key's current pin: another
// source's pin, unless the want names the key itself; a pin proved on
// hardware, from a simulated run.
func checkHeld(pl *Plan, w want, pins []containerd.Pin, facts *node.Facts) error {
	held := pinOf(pins, pl.Key)
	if held == nil {
		// A tampered record is no pin, but it still holds its key against
		// another source's metadata until an operator unpins it: taking
		// the key would hide what happened.
		if bad := tamperedOf(pins, pl.Key); bad != nil && bad.Source != w.Ref && pl.NamedBy != NamedByWant {
			return &ConflictError{Key: pl.Key, Held: bad.Source, HeldRef: bad.Ref, Claimed: w.Ref, NamedBy: namedWhat(pl.NamedBy), Tampered: true}
		}
		return nil
	}
	if held.Source != w.Ref && pl.NamedBy != NamedByWant {
		return &ConflictError{Key: pl.Key, Held: held.Source, HeldRef: held.Ref, Claimed: w.Ref, NamedBy: namedWhat(pl.NamedBy)}
	}
	if facts.Simulated && !held.Simulated {
		return newOutcome(ErrConflict, nil, "a simulated probe never replaces %s, which was proved on hardware; use a namespace of its own for simulated runs", held.Ref)
	}
	return nil
}

func namedWhat(by string) string {
	switch by {
	case NamedByMetadata:
		return "io.gpupin.engine and io.gpupin.engine.version metadata"
	case NamedByWant:
		return "want's engine and version"
	}
	return "repository name and tag"
}

// holds reports whether a pin was proved on this node as it is now: the
// same driver and GPUs, and proved the same way — a pin made by a
// simulated probe never stands for a proof on hardware, nor the reverse —
// and that its record still points at the image its name says.
func holds(pin *containerd.Pin, facts *node.Facts) bool {
	return pin != nil && !pin.Tampered && pin.Node == facts.Fingerprint() && pin.Simulated == facts.Simulated
}

// tamperedOf is a tampered record of key, if any.
func tamperedOf(pins []containerd.Pin, key string) *containerd.Pin {
	for i := range pins {
		if pins[i].Key == key && pins[i].Tampered {
			return &pins[i]
		}
	}
	return nil
}

func pinOf(pins []containerd.Pin, key string) *containerd.Pin {
	for i := range pins {
		if pins[i].Key == key && !pins[i].Tampered {
			return &pins[i]
		}
	}
	return nil
}

// choose orders the variants the node can run into the plan's candidates,
// each with the probe Provision will run on it, and a reason for every
// rejection.
func (pl *Plan) choose(set *images.Set, choice images.Override, defaultProbe string) error {
	if cimages.IsIndexType(set.MediaType) {
		pl.Index = set.Digest
	}
	c := images.Choose(pl.Node, set, choice)
	pl.Candidates, pl.Rejected, pl.Outcome, pl.Detail = c.Candidates, c.Rejected, c.Outcome, c.Detail
	for i := range pl.Candidates {
		k, err := probeKindOf(pl.Candidates[i].Meta, pl.Engine, defaultProbe)
		if err != nil {
			return fmt.Errorf("candidate %s: %w", pl.Candidates[i].Variant, err)
		}
		pl.Candidates[i].Probe = string(k)
	}
	for _, v := range set.Variants {
		pl.Derived = pl.Derived || v.Derived
	}
	if pl.Outcome == OutcomeNoCandidate {
		reasons := make([]string, 0, len(pl.Rejected))
		for _, r := range pl.Rejected {
			reasons = append(reasons, r.Variant+": "+r.Reason)
		}
		detail := pl.Detail
		if len(reasons) > 0 {
			detail += ": " + strings.Join(reasons, "; ")
		}
		pl.Err = newOutcome(ErrNoCandidate, nil, "%s", detail)
	}
	return nil
}

// decideReading decides for w on r, reading what the decision asks for
// (each once) until it is made. resolving, if set, is told before the
// registry is first asked: a pin that answers is no resolution.
func (p *Provisioner) decideReading(ctx context.Context, w want, r *reads, resolving func()) (*Plan, error) {
	if r.overrides == nil {
		r.overrides = map[string]applied{}
	}
	if resolving == nil {
		resolving = func() {}
	}
	for {
		pl, n, err := decide(w, r, p.opts.DefaultProbe)
		if err != nil || n.kind == needNothing {
			return pl, err
		}
		if err := p.read(ctx, w, r, n, resolving); err != nil {
			return nil, err
		}
	}
}

// read reads what decide asked for into r.
func (p *Provisioner) read(ctx context.Context, w want, r *reads, n need, resolving func()) error {
	switch n.kind {
	case needOverride:
		o, ok, err := p.opts.Overrides.Override(n.engine)
		if err != nil {
			return fmt.Errorf("overrides for %s: %w", n.engine, err)
		}
		a := applied{images.Override{Kind: images.OverrideAuto}, OverrideFromDefault}
		if ok {
			a = applied{o, OverrideFromSource}
		}
		r.overrides[n.engine] = a
	case needSet:
		resolving()
		set, err := p.opts.Resolver.ResolveReference(ctx, w.parsedRef)
		if err != nil {
			return err
		}
		if set == nil {
			return fmt.Errorf("resolve %s: the resolver answered nothing", w.Ref)
		}
		r.set = set
	case needImage:
		if r.set == nil {
			resolving() // the registry's first question: a want's own image
		}
		set, err := p.resolve(ctx, n.ref)
		if err != nil {
			return fmt.Errorf("override image: %w", err)
		}
		if set == nil {
			return fmt.Errorf("override image: resolve %s: the resolver answered nothing", n.ref)
		}
		r.image = set
	default:
		return fmt.Errorf("decide asked for an unknown read %d", n.kind)
	}
	return nil
}

// name sets the plan's key: the want's engine and version, else the
// image's metadata, else the repository's last element and the tag.
func (pl *Plan) name(w want, set *images.Set) {
	engine, version := w.Engine, w.Version
	by := NamedByWant
	if set != nil {
		for _, v := range set.Variants {
			if engine == "" && v.Engine != "" {
				engine, by = v.Engine, NamedByMetadata
			}
			if version == "" && v.EngineVersion != "" {
				version, by = v.EngineVersion, NamedByMetadata
			}
		}
	}
	if engine == "" {
		engine, by = images.EngineFromRepo(w.parsedRef), namedBy(by)
	}
	if version == "" {
		version, by = w.parsedRef.Identifier(), namedBy(by)
		if strings.HasPrefix(version, "sha256:") {
			version = version[:19]
		}
	}
	pl.Engine, pl.Version, pl.NamedBy = engine, version, by
	pl.Key = engine + ":" + version
}

// namedBy: a key named partly by metadata is still not the want's.
func namedBy(prev string) string {
	if prev == NamedByMetadata {
		return NamedByMetadata
	}
	return NamedByReference
}

// validKey refuses, before anything is pulled, a key a pin cannot carry.
func validKey(engine, version string) error {
	if !images.ValidEngineName(engine) {
		return fmt.Errorf("%w: engine name %q (from the image or its repository) is not one gpupin pins under: lower-case letters, digits, '.', '_', '-', at most 64; name the engine in the want", ErrInvalidWant, engine)
	}
	if strings.HasPrefix(version, "sha256:") {
		return nil
	}
	if !images.ValidEngineVersion(version) {
		return fmt.Errorf("%w: engine version %q is not one gpupin pins under; name the version in the want", ErrInvalidWant, version)
	}
	return nil
}
