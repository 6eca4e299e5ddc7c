// Package provision ties the parts together: from a wanted engine and the
// node's facts to a pinned image that was seen to compute, with fallback,
// one worker per engine, and a loop that converges on the wanted set.
package provision

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/runtime"
)

// Want is an engine the caller wants on this node.
type Want struct {
	// Engine and Version name the pin (engine:version); when empty they
	// come from the image's metadata, else its repository and tag.
	Engine  string `json:"engine,omitempty"`
	Version string `json:"version,omitempty"`
	Ref     string `json:"ref"`
	// Override is auto, none, a variant name or an image reference.
	Override string `json:"override,omitempty"`
}

// Key names the want before anything is resolved.
func (w Want) Key() string {
	if w.Engine != "" && w.Version != "" {
		return w.Engine + ":" + w.Version
	}
	return w.Ref
}

// State is where a provision stands.
type State string

const (
	Pending     State = "pending"
	Pulling     State = "pulling"
	Probing     State = "probing"
	Ready       State = "ready"
	Failed      State = "failed"
	Unsupported State = "unsupported"
	Disabled    State = "disabled"
)

// Attempt is one candidate that was tried and failed.
type Attempt struct {
	Variant string `json:"variant"`
	Ref     string `json:"ref"`
	Stage   string `json:"stage"` // pull or probe
	Reason  string `json:"reason"`
	Output  string `json:"output,omitempty"` // tail of the probe's output
}

// Status is the outcome of provisioning one want, with a detail a person
// can act on.
type Status struct {
	Key      string `json:"key"`
	Engine   string `json:"engine"`
	Version  string `json:"version"`
	Ref      string `json:"ref"`
	Override string `json:"override"`
	State    State  `json:"state"`
	Detail   string `json:"detail"`
	Variant  string `json:"variant,omitempty"`
	// Pinned is the repo@sha256:… replicas start from. A failed status
	// carries it too when an earlier pin, proved on this node as it is,
	// stays in place.
	Pinned  string         `json:"pinned,omitempty"`
	Pin     *runtime.Pin   `json:"pin,omitempty"`
	Verdict *probe.Verdict `json:"verdict,omitempty"`
	// ProbeOutput is the tail of the passing probe's output.
	ProbeOutput string             `json:"probe_output,omitempty"`
	Attempts    []Attempt          `json:"attempts,omitempty"`
	Rejected    []images.Rejection `json:"rejected,omitempty"`
	Simulated   bool               `json:"simulated"`
	// Cancelled is true when the caller's context ended the provision:
	// the status answers nothing about the image.
	Cancelled bool `json:"cancelled,omitempty"`
	// FromPin is true when an existing pin answered without the registry.
	FromPin  bool          `json:"from_pin"`
	Duration time.Duration `json:"duration_ns"`
	At       time.Time     `json:"at"`
}

func (s Status) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", s.Key, s.State)
	if s.Variant != "" {
		fmt.Fprintf(&b, " (%s)", s.Variant)
	}
	if s.Detail != "" {
		fmt.Fprintf(&b, ": %s", s.Detail)
	}
	return b.String()
}

func attemptsSummary(as []Attempt) string {
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = fmt.Sprintf("%s failed at %s: %s", a.Variant, a.Stage, firstLine(a.Reason))
	}
	return strings.Join(parts, "; ")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
