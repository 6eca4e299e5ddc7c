package provision

import (
	"errors"
	"fmt"

	"github.com/gpupin/gpupin/containerd"
)

// Outcomes a caller can branch on, with errors.Is on Status.Err or on the
// error Plan returns. Each Status of a state other than ready carries one.
var (
	// ErrNoCandidate: no variant of the reference can run on this node
	// (every rejection is in Status.Rejected).
	ErrNoCandidate = errors.New("no candidate")
	// ErrUnsupported: the node cannot run any variant (no NVIDIA driver).
	ErrUnsupported = errors.New("unsupported node")
	// ErrDisabled: the override is none.
	ErrDisabled = errors.New("disabled by override")
	// ErrConflict: the pin key is held from another source (see *ConflictError).
	ErrConflict = errors.New("pin key held from another source")
	// ErrAllFailed: every candidate tried failed (see Status.Attempts).
	ErrAllFailed = errors.New("every candidate failed")
	// ErrInvalidWant: the want itself is malformed.
	ErrInvalidWant = errors.New("invalid want")
	// ErrTampered: a record named as a pin points at another image. It is
	// containerd's sentinel, so errors.Is works whichever package said it.
	ErrTampered = containerd.ErrTampered
)

// ConflictError is a want whose image names a pin key that is already
// pinned from another source: an image's metadata never decides whose
// pin it is.
type ConflictError struct {
	Key     string // engine:version
	Held    string // the source the key is pinned from
	Claimed string // the source that claims it now
	NamedBy string // how the claimant's key was named: metadata or reference
	// HeldRef is the record that holds the key, when it is known.
	HeldRef string `json:",omitempty"`
	// Tampered: the record holding the key was repointed outside gpupin.
	// It is no pin, yet it holds the key until an operator unpins it.
	Tampered bool `json:",omitempty"`
	// Race: the holder's pin landed while the claimant was being proved
	// (another process, another lock directory); nothing was displaced.
	Race bool `json:",omitempty"`

	cause error // containerd's *HeldError, for a race
}

func (e *ConflictError) Unwrap() error { return e.cause }

func (e *ConflictError) Error() string {
	switch {
	case e.Tampered:
		return fmt.Sprintf("%s is held by %s, a record pinned from %s that was changed outside gpupin (it points at another image than its name says): "+
			"it is never run, and it holds the key until an operator unpins it; %s names itself %s too (by its %s): refusing to let it take the key; "+
			"gpupin unpin %s (or gpupin gc) first, or name the engine and version in the want to move the pin on purpose",
			e.Key, e.HeldRef, e.Held, e.Claimed, e.Key, e.NamedBy, e.Key)
	case e.Race:
		return fmt.Sprintf("%s was pinned from %s by another provision while %s was being proved: refusing to displace another source's pin; "+
			"unpin %s first, or name the engine and version in the want to move the pin on purpose",
			e.Key, e.Held, e.Claimed, e.Key)
	}
	return fmt.Sprintf("%s is pinned from %s, and %s names itself %s too (by its %s): refusing to displace another source's pin; "+
		"unpin %s first, or name the engine and version in the want to move the pin on purpose",
		e.Key, e.Held, e.Claimed, e.Key, e.NamedBy, e.Key)
}

func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// PullError is a candidate that could not be pulled.
type PullError struct {
	Variant, Ref string
	Err          error
}

func (e *PullError) Error() string { return fmt.Sprintf("pull %s (%s): %v", e.Ref, e.Variant, e.Err) }
func (e *PullError) Unwrap() error { return e.Err }

// outcome is an error carrying the detail a person reads, classed by a
// sentinel for errors.Is.
type outcome struct {
	class  error
	detail string
	cause  error
}

func (e *outcome) Error() string { return e.detail }

func (e *outcome) Unwrap() []error {
	out := []error{e.class}
	if e.cause != nil {
		out = append(out, e.cause)
	}
	return out
}

func newOutcome(class error, cause error, format string, args ...any) error {
	return &outcome{class: class, detail: fmt.Sprintf(format, args...), cause: cause}
}
