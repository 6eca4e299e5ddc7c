package containerd

import (
	"context"

	"github.com/gpupin/gpupin/containerd/conn"
	"github.com/gpupin/gpupin/containerd/pins"
)

// The pin store's types (package pins).
type (
	Pin           = pins.Pin
	Signature     = pins.Signature
	SetPinOptions = pins.SetPinOptions
	HeldError     = pins.HeldError
	Recovered     = pins.Recovered
	Collected     = pins.Collected
	Swept         = pins.Swept
	LocalNames    = pins.LocalNames
	CRIPinning    = pins.CRIPinning
)

const (
	// DefaultLocalPrefix is where a pin's node-local name lives unless
	// WithLocalPrefix says otherwise: gpupin.local/ENGINE:VERSION.
	DefaultLocalPrefix = pins.DefaultLocalPrefix
	// PinLeaseRole is the io.gpupin.role of the lease that holds a pin's
	// content.
	PinLeaseRole = pins.PinLeaseRole
	// CRINamespace is the containerd namespace of the CRI plugin's images.
	CRINamespace = pins.CRINamespace
	CRISeen      = pins.CRISeen
	CRIJudged    = pins.CRIJudged
)

var (
	ErrTampered   = conn.ErrTampered
	ErrNoPin      = pins.ErrNoPin
	ErrHeld       = pins.ErrHeld
	ErrSuperseded = pins.ErrSuperseded
)

// FindPin picks target's pin from pins (as Pins lists them), as PinToRun
// does (pins.FindPin).
func FindPin(ps []Pin, target string) (*Pin, error) { return pins.FindPin(ps, target) }

// LocalName is the node-local name of the pin of key (engine:version)
// under prefix (pins.LocalName).
func LocalName(prefix, key string) (string, error) { return pins.LocalName(prefix, key) }

// CRIPinningOf judges a containerd version string (pins.CRIPinningOf).
func CRIPinningOf(version string) CRIPinning { return pins.CRIPinningOf(version) }

// Pins lists the current pins, recovering first (pins.Store.Pins).
func (r *Runtime) Pins(ctx context.Context) ([]Pin, error) { return r.pins.Pins(ctx) }

// ListPins lists the pins as containerd holds them now, without
// recovering first.
func (r *Runtime) ListPins(ctx context.Context) ([]Pin, error) { return r.pins.ListPins(ctx) }

// PreviousPins lists the records kept for rollback.
func (r *Runtime) PreviousPins(ctx context.Context) ([]Pin, error) { return r.pins.PreviousPins(ctx) }

// GetPin returns the pin of engine:version, or nil.
func (r *Runtime) GetPin(ctx context.Context, key string) (*Pin, error) {
	return r.pins.GetPin(ctx, key)
}

// PinToRun is the pin a replica of target starts from.
func (r *Runtime) PinToRun(ctx context.Context, target string) (*Pin, error) {
	return r.pins.PinToRun(ctx, target)
}

// SetPin makes p.Ref the pin of p.Key (pins.Store.SetPin).
func (r *Runtime) SetPin(ctx context.Context, p Pin, opts SetPinOptions) error {
	return r.pins.SetPin(ctx, p, opts)
}

// Unpin removes the pin of key and its local names.
func (r *Runtime) Unpin(ctx context.Context, key string) (*Pin, error) { return r.pins.Unpin(ctx, key) }

// DiscardCandidate removes a record this process pulled for a candidate
// that did not pass.
func (r *Runtime) DiscardCandidate(ctx context.Context, name string) error {
	return r.pins.DiscardCandidate(ctx, name)
}

// Recover puts back pins that other clients of containerd took
// (pins.Store.Recover).
func (r *Runtime) Recover(ctx context.Context) ([]Recovered, error) { return r.pins.Recover(ctx) }

// OnForeign sets f to hear of every foreign record of a node-local name
// that was replaced or removed; nil stops it.
func (r *Runtime) OnForeign(f func(Recovered)) { r.pins.OnForeign(f) }

// GC is `gpupin gc`: Sweep, then gpupin's image records that no pin and no
// container uses (pins.Store.GC).
func (r *Runtime) GC(ctx context.Context, all bool) (Collected, error) { return r.pins.GC(ctx, all) }

// Sweep removes what an interrupted gpupin left (pins.Store.Sweep).
func (r *Runtime) Sweep(ctx context.Context) (Swept, error) { return r.pins.Sweep(ctx) }

// SweepOrphans is Sweep without the partial leases.
func (r *Runtime) SweepOrphans(ctx context.Context) (Swept, error) { return r.pins.SweepOrphans(ctx) }

// LocalPrefix is the prefix of the node-local names this runtime makes.
func (r *Runtime) LocalPrefix() string { return r.pins.LocalPrefix() }

// LocalName is the node-local name of the pin of key under this runtime's
// prefix.
func (r *Runtime) LocalName(key string) string { return r.pins.LocalName(key) }

// LocalNames says whether containerd's hosts configuration names a mirror
// for the local prefix's host.
func (r *Runtime) LocalNames(ctx context.Context) (LocalNames, error) { return r.pins.LocalNames(ctx) }

// CRIPinning asks the daemon's CRI plugin whether it reports pins as
// pinned, else judges from its version.
func (r *Runtime) CRIPinning(ctx context.Context) (CRIPinning, error) { return r.pins.CRIPinning(ctx) }
