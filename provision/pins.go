package provision

import (
	"context"
	"errors"

	"github.com/gpupin/gpupin/containerd"
)

// PinReader lists pins. Pins first restores any pin another client took
// (it writes); ListPins reads them as containerd holds them, for whatever
// only looks: Plan, `gpupin pins`.
type PinReader interface {
	Pins(ctx context.Context) ([]containerd.Pin, error)
	ListPins(ctx context.Context) ([]containerd.Pin, error)
	PreviousPins(ctx context.Context) ([]containerd.Pin, error)
}

// PinStatus is a pin as `gpupin pins` shows it: whether it still holds on
// this node, and what its verdict says was simulated.
type PinStatus struct {
	containerd.Pin
	// Valid is true when the pin was proved under this node's fingerprint;
	// nil when the node's facts could not be read.
	Valid *bool `json:"valid,omitempty"`
	// SimulatedChecks are the checks its verdict says were simulated.
	SimulatedChecks []string `json:"simulated_checks,omitempty"`
	// VerdictTruncated: the verdict label was cut, and what it said of
	// simulated checks is lost (VerdictError says so).
	VerdictTruncated bool   `json:"verdict_truncated,omitempty"`
	VerdictError     string `json:"verdict_error,omitempty"`
}

// Pins lists the pins (with previous, also those kept for rollback), each
// judged against the node as it is now. A node whose facts cannot be read
// leaves Valid unset rather than failing the list.
func (p *Provisioner) Pins(ctx context.Context, previous bool) ([]PinStatus, error) {
	// Read as containerd holds them: a listing writes nothing (Pins would
	// restore a pin another client took).
	pins, err := p.rt.ListPins(ctx)
	if err != nil {
		return nil, err
	}
	if previous {
		prev, err := p.rt.PreviousPins(ctx)
		if err != nil {
			return nil, err
		}
		pins = append(pins, prev...)
	}
	fp := ""
	if f, err := p.opts.Node.Read(ctx); err == nil && f.Supported() {
		fp = f.Fingerprint()
	}
	out := make([]PinStatus, len(pins))
	for i, pin := range pins {
		out[i].Pin = pin
		v, err := ReadPinVerdict(pin.Verdict)
		out[i].SimulatedChecks = v.SimulatedChecks
		if err != nil {
			out[i].VerdictTruncated = errors.Is(err, ErrVerdictTruncated)
			out[i].VerdictError = err.Error()
		}
		if fp != "" {
			valid := pin.Node == fp
			out[i].Valid = &valid
		}
	}
	return out, nil
}

// Replica is what RunPinned says of a replica before it starts.
type Replica struct {
	Pin containerd.Pin
	// Stale: the pin was proved under another driver or GPU set than the
	// node has now; a provision proves it again.
	Stale bool
	// Simulated: the node's facts, or the pin's, are simulated; no GPU
	// was proved.
	Simulated bool
}

// RunPinned starts a replica from target's pin (containerd.FindPin: a key,
// a pinned reference, or the source a pin was made from) and waits for
// its end. Only a pin runs: none is ErrNoPin, a tampered record
// ErrTampered. The image, role, pin label and GPUs are RunPinned's: the
// provisioner's (WithGPUs), else every GPU by CDI, none on a simulated
// node. starting, when not nil, is told of the replica first.
func (p *Provisioner) RunPinned(ctx context.Context, target string, spec containerd.RunSpec, starting func(Replica)) (containerd.RunResult, error) {
	pins, err := p.rt.Pins(ctx)
	if err != nil {
		return containerd.RunResult{}, err
	}
	pin, err := containerd.FindPin(pins, target)
	if err != nil {
		return containerd.RunResult{}, err
	}
	r := Replica{Pin: *pin, Simulated: pin.Simulated}
	// Facts that cannot be read (no NVML) judge nothing: the pin runs.
	facts, err := p.opts.Node.Read(ctx)
	if err == nil {
		r.Simulated = r.Simulated || facts.Simulated
		r.Stale = facts.Supported() && facts.Fingerprint() != pin.Node
	}
	spec.GPUs = containerd.DefaultGPUs(err == nil && facts.Simulated)
	if p.opts.GPUs != nil {
		spec.GPUs = *p.opts.GPUs
	}
	spec.Image, spec.Role = pin.Ref, "replica"
	spec.Labels = map[string]string{containerd.LabelPin: pin.Key}
	if starting != nil {
		starting(r)
	}
	return p.rt.Run(ctx, spec)
}
