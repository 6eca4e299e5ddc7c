package provision

import (
	"context"
	"errors"
)

// FetchGate orders a node's pulls against other nodes' (package fetchgate:
// about one node of a fleet fetches a new digest from upstream, the others
// then pull it through their mirror). Fetch calls pull at most once, when
// this node's turn comes, and returns its error; it returns without
// calling it only when ctx ends. note says, for the status, why it waits.
type FetchGate interface {
	Fetch(ctx context.Context, ref string, note func(detail string),
		pull func(ctx context.Context, progress func(done, total int64)) error) error
}

// WithFetchGate has every candidate's pull wait for its turn (default:
// none; each pull starts at once).
func WithFetchGate(g FetchGate) Option {
	return func(c *config) error {
		if g == nil {
			return errors.New("WithFetchGate(nil): leave the option out")
		}
		c.FetchGate = g
		return nil
	}
}

// gatedPull runs pull through the gate, if there is one; a wait's note
// becomes the status's detail, and stays in it for the pull (which node
// fetched, or why this one goes upstream).
func (p *Provisioner) gatedPull(ctx context.Context, st *Status, ref string, pull func(ctx context.Context, progress func(done, total int64)) error) error {
	if p.opts.FetchGate == nil {
		return pull(ctx, func(int64, int64) {})
	}
	base := st.Detail
	return p.opts.FetchGate.Fetch(ctx, ref, func(detail string) {
		st.Detail = base + ": " + detail
		p.emit(ctx, *st)
	}, pull)
}
