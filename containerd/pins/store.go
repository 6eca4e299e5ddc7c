// Package pins is gpupin's pin store: a pin is an image record labelled as
// proved on this node, and containerd is the database (no state file).
//
// Start with Store.SetPin and Store.Pins (pin.go). Around them: the pin
// lock that serialises one key's steps across processes (pinlock.go);
// Recover, which puts back pins other clients of containerd took and keeps
// each pin's proof, lease and local name in step (recover.go), and reads,
// decides and acts in files of their own: the proof's encoding (proof.go),
// what containerd holds for a key (state.go), the decisions over those
// values, which call nothing (decide.go), and the repairs (repair.go); the
// node-local names and their upkeep (local.go); whether kubelet's image GC
// keeps pins (cri.go); and the cleanup after gpupin: Sweep (sweep.go) and
// GC (gc.go).
package pins

import (
	"context"
	"errors"
	"sync"

	"github.com/gpupin/gpupin/containerd/conn"
)

// Store keeps the pins of one containerd namespace.
type Store struct {
	conn        *conn.Conn
	localPrefix string // of the node-local names (local.go)
	synced      func(ctx context.Context) error
	sweepProbes func(ctx context.Context) (int, error)

	foreignMu sync.Mutex
	onForeign func(Recovered) // OnForeign
}

// Deps is what the store needs of the other parts, given as functions so
// that it imports neither. Both are required.
type Deps struct {
	// Synced puts what pulls extracted so far on disk (pull.Puller.Sync):
	// SetPin waits for it, as a pin says the image's files are there.
	Synced func(ctx context.Context) error
	// SweepProbes removes the probe containers whose owner is gone
	// (run.Runner.SweepProbes): Sweep's first step.
	SweepProbes func(ctx context.Context) (int, error)
}

// New is a Store over c whose node-local names are under localPrefix
// (CheckLocalPrefix; "" is DefaultLocalPrefix). A missing Deps function
// is refused here rather than met as a nil call at the first SetPin or
// Sweep.
func New(c *conn.Conn, localPrefix string, d Deps) (*Store, error) {
	if d.Synced == nil || d.SweepProbes == nil {
		return nil, errors.New("pins.New: Deps.Synced and Deps.SweepProbes are both required")
	}
	if localPrefix == "" {
		localPrefix = DefaultLocalPrefix
	}
	return &Store{conn: c, localPrefix: localPrefix, synced: d.Synced, sweepProbes: d.SweepProbes}, nil
}
