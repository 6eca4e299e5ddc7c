package provision

import (
	"fmt"
	"strings"

	"github.com/gpupin/gpupin/images"
)

// Want is an engine the caller wants on this node.
type Want struct {
	// Engine and Version name the pin (engine:version). When both are
	// given, the want owns that key and may move it from another source;
	// when empty they come from the image's metadata, else its repository
	// and tag, and never displace another source's pin.
	Engine  string `json:"engine,omitempty"`
	Version string `json:"version,omitempty"`
	Ref     string `json:"ref"`
	// Override is auto, none, a variant name or an image reference; empty
	// means the operator's override of the engine, else auto.
	Override string `json:"override,omitempty"`
}

// Key names the want before anything is resolved.
func (w Want) Key() string {
	if w.Engine != "" && w.Version != "" {
		return w.Engine + ":" + w.Version
	}
	return w.Ref
}

// ValidateWant checks a want before anything is fetched: a reference that
// parses, an engine and a version of the strict grammar pins are named
// with, an override of one of the accepted forms.
func ValidateWant(w Want) error {
	_, err := readWant(w)
	return err
}

// want is a Want read once, where it enters (Provision, Plan, Name,
// ProbeTarget, a Loop's SetWants): everything below takes the parsed
// reference and override from here and never parses the strings again.
type want struct {
	Want
	parsedRef images.Reference
	// ownOverride is the want's own, parsed; Kind is empty when it names
	// none, and the operator's override of the engine applies (overrideFor).
	ownOverride images.Override
}

// readWant checks w (ValidateWant) and parses it.
func readWant(w Want) (want, error) {
	bad := func(format string, args ...any) (want, error) {
		return want{}, fmt.Errorf("%w: %s", ErrInvalidWant, fmt.Sprintf(format, args...))
	}
	if strings.TrimSpace(w.Ref) == "" {
		return bad("ref is empty")
	}
	ref, err := images.ParseReference(w.Ref)
	if err != nil {
		return bad("ref: %v", err)
	}
	if w.Engine != "" {
		if err := images.CheckEngine(w.Engine); err != nil {
			return bad("engine %v", err)
		}
	}
	if w.Version != "" && !images.ValidEngineVersion(w.Version) {
		return bad("version %q is not an engine version (letters, digits, '.', '_', '+', '-', at most 128)", w.Version)
	}
	pw := want{Want: w, parsedRef: ref}
	if w.Override != "" {
		if pw.ownOverride, err = images.ParseOverride(w.Override); err != nil {
			return bad("override: %v", err)
		}
	}
	return pw, nil
}

// namesKey: the want gives engine and version, so it owns that key.
func (w want) namesKey() bool { return w.Engine != "" && w.Version != "" }
