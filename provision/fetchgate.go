package provision

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
)

// FetchGate orders a node's pulls against other nodes' (package fetchgate:
// about one node of a fleet fetches a new digest from upstream, the others
// then pull it through their mirror). Fetch calls pull at most once, when
// this node's turn comes, and returns its error; it returns without
// calling it only when ctx ends. note says, for the status, why it waits.
// await, where not nil, is asked before each layer blob is fetched: it
// returns once a peer has it (or the node is to fetch it itself).
type FetchGate interface {
	Fetch(ctx context.Context, ref string, note func(detail string), pull GatedPull) error
}

// GatedPull is a pull the gate runs.
type GatedPull = func(ctx context.Context, progress func(done, total int64), await func(ctx context.Context, layer string) error) error

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
func (p *Provisioner) gatedPull(ctx context.Context, st *Status, ref string, pull GatedPull) error {
	if p.opts.FetchGate == nil {
		return pull(ctx, func(int64, int64) {}, nil)
	}
	base := st.Detail
	return p.opts.FetchGate.Fetch(ctx, ref, func(detail string) {
		st.Detail = base + ": " + detail
		p.emit(ctx, *st)
	}, pull)
}

// ImageStored is the fetch gate's WithStored over rt: the layers of the
// manifest ref names (for an index, of each child present) committed to
// rt's content store, where the node's Spegel serves them from, in the
// manifests' order, and whether that is every one.
func ImageStored(rt *containerd.Runtime) func(ctx context.Context, ref string) (layers []string, all bool) {
	return func(ctx context.Context, ref string) ([]string, bool) {
		i := strings.LastIndexByte(ref, '@')
		if i < 0 {
			return nil, false
		}
		dg, err := digest.Parse(ref[i+1:])
		if err != nil {
			return nil, false
		}
		ctx = namespaces.WithNamespace(ctx, rt.Namespace())
		var layers []string
		all := blobsStored(ctx, rt.Client().ContentStore(), dg, 0, &layers)
		return layers, all
	}
}

// blobsStored appends to stored the layers of dg's manifest (or of its
// index's children present) that are committed, and says whether all are.
func blobsStored(ctx context.Context, cs content.Store, dg digest.Digest, depth int, stored *[]string) bool {
	raw, err := content.ReadBlob(ctx, cs, ocispec.Descriptor{Digest: dg})
	if err != nil {
		return false
	}
	var m struct {
		Layers    []ocispec.Descriptor `json:"layers"`
		Manifests []ocispec.Descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return false
	}
	all := true
	for _, l := range m.Layers {
		if _, err := cs.Info(ctx, l.Digest); err != nil {
			all = false
			continue
		}
		if !slices.Contains(*stored, l.Digest.String()) {
			*stored = append(*stored, l.Digest.String())
		}
	}
	children := 0
	for _, c := range m.Manifests {
		if _, err := cs.Info(ctx, c.Digest); err != nil || depth > 0 {
			continue // another platform's, not pulled
		}
		if !blobsStored(ctx, cs, c.Digest, depth+1, stored) {
			all = false
		}
		children++
	}
	// An index none of whose children is here has nothing stored yet.
	return all && (len(m.Layers) > 0 || children > 0)
}
