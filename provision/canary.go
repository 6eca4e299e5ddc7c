package provision

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// Canary has the first node of a GPU class prove a new engine version
// before the class's other nodes try it (package canary; docs/fleet.md).
// Await returns when this node may try key's candidates: at once when it
// is the class's canary (lead is then true, and done, called once the
// provision's status is out, hands the verdict on), else with the
// canary's verdict, or with none once the wait's bound has passed. note
// says, for the status, whom it waits on.
type Canary interface {
	Await(ctx context.Context, class, key string, note func(canary string)) (v CanaryVerdict, done func(), err error)
}

// CanaryVerdict is what a class's canary saw of a version's variants.
type CanaryVerdict struct {
	// Node is the canary; "" when this node is the canary itself, or
	// waited in vain (Reason says why).
	Node string
	// Passed is the variant the canary pinned ("" if none).
	Passed string
	// Failed are the variants whose probe failed there, with why: a
	// probe's failure belongs to the GPUs and driver, not to the node.
	Failed map[string]string
	// Reason says why there is no verdict, when there is none.
	Reason string
}

// WithCanary has a node wait, before it tries a new version's variants
// under auto, for its GPU class's canary, and skip what failed there
// (default: none; each node tries every candidate itself).
func WithCanary(c Canary) Option {
	return func(cfg *config) error {
		if c == nil {
			return errors.New("WithCanary(nil): leave the option out")
		}
		cfg.Canary = c
		return nil
	}
}

// Class is a node's GPU class for a canary, as `gpupin fleet` groups
// nodes: its GPU models and the driver's branch (the major version: a
// point release does not change what a probe sees). Simulated nodes form
// classes of their own, so no real node follows a simulated verdict.
func Class(f *node.Facts) string {
	models := map[string]bool{}
	for _, g := range f.GPUs {
		models[g.Name] = true
	}
	names := make([]string, 0, len(models))
	for m := range models {
		names = append(names, m)
	}
	sort.Strings(names)
	branch, _, _ := strings.Cut(f.Driver, ".")
	c := strings.Join(names, "+") + " driver " + branch
	if f.Simulated {
		c += " simulated"
	}
	return c
}

// awaitCanary asks the class's canary before pl's candidates are tried,
// and returns those to try: the canary's failed variants become attempts
// of stage canary, not tried here. Only auto follows a canary: a forced
// variant or an operator's image is the operator's call on this node.
func (p *Provisioner) awaitCanary(ctx context.Context, st *Status, pl *Plan) ([]images.Candidate, func()) {
	if p.opts.Canary == nil || pl.override.Kind != images.OverrideAuto || len(pl.Candidates) == 0 {
		return pl.Candidates, func() {}
	}
	v, done, err := p.opts.Canary.Await(ctx, Class(pl.Node), pl.Key, func(canary string) {
		st.Canary = canary
		st.State, st.Detail = Resolving, "waiting on canary "+canary+" (same GPUs and driver branch) to prove "+pl.Key
		p.emit(ctx, *st)
	})
	if err != nil {
		// No verdict is no reason not to try: the canary only saves
		// doomed attempts.
		p.opts.Logger.Warn("canary not asked; trying every candidate", "key", pl.Key, "err", err)
		return pl.Candidates, func() {}
	}
	if done == nil {
		done = func() {}
	}
	st.Canary = v.Node
	if v.Node == "" {
		if v.Reason != "" {
			p.opts.Logger.Info("no canary verdict; trying every candidate", "key", pl.Key, "reason", v.Reason)
		}
		return pl.Candidates, done
	}
	var try []images.Candidate
	for _, c := range pl.Candidates {
		if why, failed := v.Failed[c.Variant]; failed {
			st.Attempts = append(st.Attempts, Attempt{Variant: c.Variant, Ref: c.Ref, Stage: "canary",
				Reason: fmt.Sprintf("not tried: its probe failed on canary %s (same GPUs and driver branch): %s", v.Node, why)})
			continue
		}
		try = append(try, c)
	}
	p.opts.Logger.Info("canary verdict", "key", pl.Key, "canary", v.Node, "passed", v.Passed, "skipped", len(pl.Candidates)-len(try))
	return try, done
}
