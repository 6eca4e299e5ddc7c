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

// Outcomes of a plan beyond images' (ready-to-provision, none,
// unsupported, no-candidate).
const (
	// OutcomePinned: a pin proved on this node as it is answers; nothing
	// is resolved or pulled.
	OutcomePinned = "pinned"
	// OutcomeConflict: provisioning would displace a pin it must not.
	OutcomeConflict = "conflict"
)

// How a plan's key was named.
const (
	NamedByWant      = "want"      // the want gave engine and version
	NamedByMetadata  = "metadata"  // io.gpupin.engine / io.gpupin.engine.version
	NamedByReference = "reference" // the repository's last element and the tag
)

// Where a plan's override came from.
const (
	OverrideFromWant    = "want"
	OverrideFromSource  = "overrides"
	OverrideFromDefault = "default"
)

// Plan is what provisioning a want would do on this node, decided before
// anything is pulled: the key it pins under and how that was named, the
// override and where it came from, the candidates in the order they would
// be tried, and every rejection. Provision acts on exactly this; `gpupin
// plan` prints it.
type Plan struct {
	Ref          string `json:"ref"`
	Key          string `json:"key"`
	Engine       string `json:"engine"`
	Version      string `json:"version"`
	NamedBy      string `json:"named_by"`
	Override     string `json:"override"`
	OverrideFrom string `json:"override_from"`
	// Source is what the candidates come from: Ref, or the override's image.
	Source     string             `json:"source"`
	Node       *node.Facts        `json:"node"`
	Simulated  bool               `json:"simulated"`
	Derived    bool               `json:"derived"`
	Candidates []images.Candidate `json:"candidates"`
	Rejected   []images.Rejection `json:"rejected"`
	// Index is the digest of the index the candidates were chosen from
	// ("" for a lone manifest): a signature over it covers them too.
	Index   string `json:"-"`
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
	// Pinned is the pin that answers as it is (OutcomePinned).
	Pinned *containerd.Pin `json:"pinned,omitempty"`
	// Held is the key's current pin, whoever made it: kept if this fails.
	Held     *containerd.Pin `json:"held,omitempty"`
	Conflict *ConflictError  `json:"conflict,omitempty"`
	// Err classes every outcome but ready-to-provision and pinned.
	Err error `json:"-"`

	override images.Override
}

// Plan decides what a provision of w would do, reading the node, the pins
// and the registry's manifests, and changing nothing. Pins are read as
// containerd holds them (ListPins: restoring a pin another client took
// would write); a provisioner without containerd reads none.
func (p *Provisioner) Plan(ctx context.Context, in Want) (*Plan, error) {
	w, err := readWant(in)
	if err != nil {
		return nil, err
	}
	facts, err := p.opts.Node.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read node facts: %w", err)
	}
	pins, err := p.rt.ListPins(ctx)
	if err != nil && !errors.Is(err, errNoRuntime) {
		return nil, err
	}
	return p.plan(ctx, w, facts, pins)
}

// plan decides for w on facts and pins: the node, then a pin that answers,
// then the key and override (reading the registry), then the choice.
func (p *Provisioner) plan(ctx context.Context, w want, facts *node.Facts, pins []containerd.Pin) (*Plan, error) {
	pl := &Plan{Ref: w.Ref, Source: w.Ref, Node: facts, Simulated: facts.Simulated,
		Candidates: []images.Candidate{}, Rejected: []images.Rejection{}}
	pl.name(w, nil)
	if !facts.Supported() {
		pl.Outcome, pl.Detail = images.OutcomeUnsupported, "unsupported: "+facts.Unsupported
		pl.Err = newOutcome(ErrUnsupported, nil, "%s", pl.Detail)
		return pl, nil
	}
	// Installed wins: a pin proved on these very GPUs and driver answers
	// without the registry, so an outage cannot stop a provisioned node.
	pin, err := p.pinFor(w, pins, facts)
	if err != nil {
		return nil, err
	}
	if pin != nil {
		pl.answeredBy(pin)
		return pl, nil
	}
	set, err := p.nameAndOverride(ctx, pl, w)
	if err != nil {
		return nil, err
	}
	pl.Held = pinOf(pins, pl.Key)
	if pl.override.Kind == images.OverrideNone {
		pl.Outcome, pl.Detail = images.OutcomeNone, "override is none: this node does not run this engine (its pin, if any, is kept until gc)"
		pl.Err = newOutcome(ErrDisabled, nil, "%s", pl.Detail)
		return pl, nil
	}
	if err := checkHeld(pl, w, pins, facts); err != nil {
		pl.Outcome, pl.Detail, pl.Err = OutcomeConflict, err.Error(), err
		errors.As(err, &pl.Conflict)
		return pl, nil
	}
	if err := p.choose(ctx, pl, set); err != nil {
		return nil, err
	}
	return pl, nil
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

// nameAndOverride reads w's reference (its variants), names the plan's key
// from it, and finds the override that applies: the want's, else the
// operator's for that engine. A want that names its key and an image
// override needs nothing of its own reference, which is then not read.
func (p *Provisioner) nameAndOverride(ctx context.Context, pl *Plan, w want) (*images.Set, error) {
	var set *images.Set
	if !(w.namesKey() && w.ownOverride.Kind == images.OverrideImage) {
		var err error
		if set, err = p.opts.Resolver.ResolveReference(ctx, w.parsedRef); err != nil {
			return nil, err
		}
	}
	pl.name(w, set)
	if err := validKey(pl.Engine, pl.Version); err != nil {
		return nil, err
	}
	ov, from, err := w.overrideFor(p.opts.Overrides, pl.Engine)
	if err != nil {
		return nil, err
	}
	pl.override, pl.Override, pl.OverrideFrom = ov, ov.String(), from
	return set, nil
}

// resolve reads a reference that is not a want's (an override's image, a
// pin's source) down to its variants.
func (p *Provisioner) resolve(ctx context.Context, ref string) (*images.Set, error) {
	pr, err := images.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	return p.opts.Resolver.ResolveReference(ctx, pr)
}

// choose orders the variants the node can run into the plan's candidates,
// each with the probe Provision will run on it, and a reason for every
// rejection. An operator's image replaces the engine's variants: they are
// chosen among by the same rules, and still probed.
func (p *Provisioner) choose(ctx context.Context, pl *Plan, set *images.Set) error {
	choice := pl.override
	if choice.Kind == images.OverrideImage {
		pl.Source = choice.Image
		var err error
		if set, err = p.resolve(ctx, choice.Image); err != nil {
			return fmt.Errorf("override image: %w", err)
		}
		choice = images.Override{Kind: images.OverrideAuto}
	}
	if cimages.IsIndexType(set.MediaType) {
		pl.Index = set.Digest
	}
	c := images.Choose(pl.Node, set, choice)
	pl.Candidates, pl.Rejected, pl.Outcome, pl.Detail = c.Candidates, c.Rejected, c.Outcome, c.Detail
	for i := range pl.Candidates {
		k, err := p.probeKind(pl.Candidates[i].Meta, pl.Engine)
		if err != nil {
			return fmt.Errorf("candidate %s: %w", pl.Candidates[i].Variant, err)
		}
		pl.Candidates[i].Probe = string(k)
	}
	for _, v := range set.Variants {
		pl.Derived = pl.Derived || v.Derived
	}
	if pl.Outcome == images.OutcomeNoCandidate {
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

// pinFor finds the pin that answers w as it is: made from w's reference
// (under w's key when the want names one), under the override that applies
// to its engine now, and proved on this node as it is.
func (p *Provisioner) pinFor(w want, pins []containerd.Pin, facts *node.Facts) (*containerd.Pin, error) {
	for i := range pins {
		pin := &pins[i]
		if pin.Source != w.Ref || pin.Tampered {
			continue
		}
		if w.namesKey() && pin.Key != w.Key() {
			continue
		}
		engine, _, _ := strings.Cut(pin.Key, ":")
		ov, _, err := w.overrideFor(p.opts.Overrides, engine)
		if err != nil {
			return nil, err
		}
		if ov.Kind == images.OverrideNone || pin.Override != ov.String() {
			continue
		}
		if holds(pin, facts) {
			return pin, nil
		}
	}
	return nil, nil
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
