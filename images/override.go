package images

import (
	"fmt"
	"strings"
)

// OverrideKind is which of the four forms an override takes.
type OverrideKind string

const (
	OverrideAuto    OverrideKind = "auto"
	OverrideNone    OverrideKind = "none"
	OverrideVariant OverrideKind = "variant"
	OverrideImage   OverrideKind = "image"
)

// Override is an operator's choice for one engine on one node.
type Override struct {
	Kind    OverrideKind
	Variant string // for OverrideVariant
	Image   string // for OverrideImage
}

// OverrideForms is said whenever an override is refused.
const OverrideForms = `accepted forms: "auto" (choose by driver and GPUs), "none" (this node does not run the engine), a variant name such as cu129, or an image reference with a registry or tag such as registry.example/org/vllm:0.11.0-custom`

// ParseOverride reads an override. A bare word is a variant name; an image
// reference must contain '/', ':' or '@', so "cu129" can never be mistaken
// for an image of that name.
func ParseOverride(s string) (Override, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "", "auto":
		return Override{Kind: OverrideAuto}, nil
	case "none":
		return Override{Kind: OverrideNone}, nil
	}
	if isYAMLBoolWord(s) {
		// A variant named "off" or "true" is never what was meant, and the
		// overrides file's YAML turns on/off/yes/no into true/false anyway.
		return Override{}, fmt.Errorf("override %q is a YAML boolean, not an override; %s", s, boolOverrideHint)
	}
	if len(s) > 512 {
		return Override{}, fmt.Errorf("override of %d bytes is too long; %s", len(s), OverrideForms)
	}
	if strings.ContainsAny(s, "/:@") {
		if _, err := ParseReference(s); err != nil {
			return Override{}, fmt.Errorf("override %q: %v; %s", s, err, OverrideForms)
		}
		return Override{Kind: OverrideImage, Image: s}, nil
	}
	if !ValidVariantName(s) {
		return Override{}, fmt.Errorf("override %q is not a variant name; %s", s, OverrideForms)
	}
	return Override{Kind: OverrideVariant, Variant: s}, nil
}

// String renders the override as ParseOverride reads it.
func (o Override) String() string {
	switch o.Kind {
	case OverrideVariant:
		return o.Variant
	case OverrideImage:
		return o.Image
	case OverrideNone:
		return "none"
	}
	return "auto"
}
