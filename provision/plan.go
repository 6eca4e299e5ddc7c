package provision

import (
	"context"
	"errors"
	"fmt"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// Outcomes of a plan, one per plan: images.Choose's four, and two of a
// node's own pins. Plan.Outcome stays a string: `plan --json` prints it,
// and callers compare it with these.
const (
	// OutcomeReady: the candidates are to be tried in turn.
	OutcomeReady = images.OutcomeReady
	// OutcomeNone: the override is none; the engine does not run here.
	OutcomeNone = images.OutcomeNone
	// OutcomeUnsupported: the node cannot run GPU engines at all.
	OutcomeUnsupported = images.OutcomeUnsupported
	// OutcomeNoCandidate: no variant suits the node.
	OutcomeNoCandidate = images.OutcomeNoCandidate
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
	return p.decideReading(ctx, w, &reads{facts: facts, pins: pins}, nil)
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
