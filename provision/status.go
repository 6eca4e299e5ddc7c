// Package provision ties the parts together: from a wanted engine and the
// node's facts to a pinned image that was seen to compute, with fallback,
// one worker per engine, and a loop that converges on the wanted set.
//
// Start with New(rt, options...) and Provision or Converge; Plan says what
// a provision would do without doing it; NewLoop keeps a node converged.
// A Status that is not ready carries Err, classed by ErrNoCandidate,
// ErrUnsupported, ErrDisabled, ErrConflict or ErrAllFailed for errors.Is.
// Pins, RunPinned and ProbeImage are what `gpupin pins`, `run` and `probe`
// call.
package provision

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/probe"
)

// State is where a provision stands.
type State string

const (
	Pending     State = "pending"
	Resolving   State = "resolving"
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
	Stage   string `json:"stage"` // pull, probe, pin or lease
	Reason  string `json:"reason"`
	Output  string `json:"output,omitempty"` // tail of the probe's output
	Err     error  `json:"-"`
}

// Status is the outcome of provisioning one want, with a detail a person
// can act on and, for every state but ready, an error to branch on.
type Status struct {
	Key      string `json:"key"`
	Engine   string `json:"engine"`
	Version  string `json:"version"`
	Ref      string `json:"ref"`
	Override string `json:"override"`
	State    State  `json:"state"`
	Detail   string `json:"detail"`
	// Attempted is the candidate variant being pulled or probed, or on a
	// failure the last one tried (Attempts has each): not what runs.
	Attempted string `json:"attempted,omitempty"`
	// Pinned is the repo@sha256:… replicas start from. A failed status
	// carries it too when an earlier pin, proved on this node as it is,
	// stays in place. Variant is Pinned's own variant, set exactly when
	// Pinned is: a forced cu13 that failed beside a cu129 pin is
	// attempted cu13, variant cu129.
	Pinned  string          `json:"pinned,omitempty"`
	Variant string          `json:"variant,omitempty"`
	Pin     *containerd.Pin `json:"pin,omitempty"`
	Verdict *probe.Verdict  `json:"verdict,omitempty"`
	// ProbeOutput is the tail of the passing probe's output.
	ProbeOutput string             `json:"probe_output,omitempty"`
	Attempts    []Attempt          `json:"attempts,omitempty"`
	Rejected    []images.Rejection `json:"rejected,omitempty"`
	// Conflict is set when the key is held from another source.
	Conflict  *ConflictError `json:"conflict,omitempty"`
	Simulated bool           `json:"simulated"`
	// Cancelled is true when the caller's context ended the provision:
	// the status answers nothing about the image.
	Cancelled bool `json:"cancelled,omitempty"`
	// Canary is the node of this one's GPU class whose verdict the
	// provision waits on or followed (WithCanary).
	Canary string `json:"canary,omitempty"`
	// FromPin is true when an existing pin answered without the registry.
	FromPin  bool          `json:"from_pin"`
	Duration time.Duration `json:"duration_ns"`
	At       time.Time     `json:"at"`
	// Err classes the outcome: ErrNoCandidate, ErrUnsupported,
	// ErrDisabled, ErrConflict, ErrAllFailed (with *PullError or
	// *probe.Failure of the attempts beneath), ErrInvalidWant. nil when
	// ready or still under way.
	Err error `json:"-"`
}

func (s Status) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", s.Key, s.State)
	switch {
	case s.State == Ready && s.Variant != "":
		fmt.Fprintf(&b, " (%s)", s.Variant)
	case s.State == Pulling || s.State == Probing:
		if s.Attempted != "" {
			fmt.Fprintf(&b, " (%s)", s.Attempted)
		}
	case s.Attempted != "" && s.Variant != "":
		fmt.Fprintf(&b, " (%s tried; %s still pinned)", s.Attempted, s.Variant)
	case s.Attempted != "":
		fmt.Fprintf(&b, " (%s tried)", s.Attempted)
	case s.Variant != "":
		fmt.Fprintf(&b, " (%s pinned)", s.Variant)
	}
	if s.Detail != "" {
		fmt.Fprintf(&b, ": %s", s.Detail)
	}
	return b.String()
}

// pending is w's status before anything is done.
func pending(w Want) Status {
	return Status{Key: w.Key(), Engine: w.Engine, Version: w.Version, Ref: w.Ref, Override: w.Override, State: Pending}
}

func (s Status) fail(err error) Status {
	s.State, s.Detail, s.Err = Failed, err.Error(), err
	var c *ConflictError
	if errors.As(err, &c) {
		s.Conflict = c
	}
	return s
}

func (s Status) ready(pin containerd.Pin, fromPin bool, detail string) Status {
	s.State, s.Detail, s.FromPin, s.Err = Ready, detail, fromPin, nil
	s.Pin, s.Pinned, s.Variant = &pin, pin.Ref, pin.Variant
	if e, v, ok := strings.Cut(pin.Key, ":"); ok {
		s.Engine, s.Version = e, v
	}
	s.Key = pin.Key
	return s
}

// String is the attempt in one line: the variant, the stage, and the
// first line of the reason (a probe's may go on with its output).
func (a Attempt) String() string {
	reason, _, _ := strings.Cut(a.Reason, "\n")
	return fmt.Sprintf("%s failed at %s: %s", a.Variant, a.Stage, reason)
}

func attemptsSummary(as []Attempt) string {
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = a.String()
	}
	return strings.Join(parts, "; ")
}

// attemptErrors joins the attempts' errors under ErrAllFailed.
func attemptErrors(as []Attempt, detail string) error {
	errs := []error{ErrAllFailed}
	for _, a := range as {
		if a.Err != nil {
			errs = append(errs, a.Err)
		}
	}
	return &outcome{class: errors.Join(errs...), detail: detail}
}
