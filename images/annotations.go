// Package images reads engine images: references, the variant metadata CI
// publishes (or that is derived from an image's config), and the choice of
// the variant a node can run.
package images

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"github.com/gpupin/gpupin/node"
)

// The annotations CI writes on each index entry and child manifest.
const (
	AnnotationEngine        = "io.gpupin.engine"
	AnnotationEngineVersion = "io.gpupin.engine.version"
	AnnotationVariant       = "io.gpupin.variant"
	AnnotationCUDA          = "io.gpupin.cuda.version"
	AnnotationDriverMin     = "io.gpupin.cuda.driver.min"
	AnnotationArchs         = "io.gpupin.cuda.archs"
	AnnotationProbe         = "io.gpupin.probe"
	// AnnotationProbeExec is also read as an image label: the exec probe's argv, JSON.
	AnnotationProbeExec = "io.gpupin.probe.exec"
)

// maxAnnotation bounds one value: metadata is a few dozen bytes, and a
// registry that sends megabytes is not to be believed.
const maxAnnotation = 4096

// Metadata is what a variant claims about itself.
type Metadata struct {
	Engine        string `json:"engine,omitempty"`
	EngineVersion string `json:"engine_version,omitempty"`
	Variant       string `json:"variant"`
	CUDA          string `json:"cuda,omitempty"`
	DriverMin     string `json:"driver_min,omitempty"`
	Archs         string `json:"archs,omitempty"`
	Probe         string `json:"probe,omitempty"`
	ProbeExec     string `json:"probe_exec,omitempty"`
}

var variantRE = regexp.MustCompile(`^[a-z][a-z0-9]*(?:[._-][a-z0-9]+)*$`)

// ValidVariantName reports whether s can name a variant: lower-case letters,
// digits and single separators, starting with a letter (cu13, cu129, cu128-sm90).
func ValidVariantName(s string) bool { return len(s) <= 64 && variantRE.MatchString(s) }

// HasMetadata reports whether annotations carry gpupin's variant metadata.
func HasMetadata(ann map[string]string) bool {
	_, ok := ann[AnnotationVariant]
	return ok
}

// ParseAnnotations reads and checks gpupin's annotations. Every value is
// validated: the index comes from a registry, and a bad value must be an
// error, not a wrong choice.
func ParseAnnotations(ann map[string]string) (Metadata, error) {
	for k, v := range ann {
		if !strings.HasPrefix(k, "io.gpupin.") {
			continue
		}
		if len(v) > maxAnnotation {
			return Metadata{}, fmt.Errorf("annotation %s: %d bytes, more than %d", k, len(v), maxAnnotation)
		}
		if i := strings.IndexFunc(v, unicode.IsControl); i >= 0 {
			return Metadata{}, fmt.Errorf("annotation %s: control character %q at byte %d", k, v[i], i)
		}
	}
	m := Metadata{
		Engine:        strings.TrimSpace(ann[AnnotationEngine]),
		EngineVersion: strings.TrimSpace(ann[AnnotationEngineVersion]),
		Variant:       strings.TrimSpace(ann[AnnotationVariant]),
		CUDA:          strings.TrimSpace(ann[AnnotationCUDA]),
		DriverMin:     strings.TrimSpace(ann[AnnotationDriverMin]),
		Archs:         strings.TrimSpace(ann[AnnotationArchs]),
		Probe:         strings.TrimSpace(ann[AnnotationProbe]),
		ProbeExec:     strings.TrimSpace(ann[AnnotationProbeExec]),
	}
	if err := m.Validate(); err != nil {
		return Metadata{}, err
	}
	return m, nil
}

// Validate checks every field that is set; variant and CUDA are required.
func (m Metadata) Validate() error {
	if m.Variant == "" {
		return fmt.Errorf("annotation %s is missing", AnnotationVariant)
	}
	if !ValidVariantName(m.Variant) {
		return fmt.Errorf("annotation %s=%q: not a variant name (lower-case letters, digits, '.', '_' or '-', e.g. cu129)", AnnotationVariant, m.Variant)
	}
	if m.CUDA == "" {
		return fmt.Errorf("variant %s: annotation %s is missing", m.Variant, AnnotationCUDA)
	}
	if _, err := node.ParseVersion(m.CUDA); err != nil {
		return fmt.Errorf("variant %s: annotation %s: %w", m.Variant, AnnotationCUDA, err)
	}
	if m.DriverMin != "" {
		if _, err := node.ParseVersion(m.DriverMin); err != nil {
			return fmt.Errorf("variant %s: annotation %s: %w", m.Variant, AnnotationDriverMin, err)
		}
	}
	if m.Archs != "" {
		if _, err := ParseArchs(m.Archs); err != nil {
			return fmt.Errorf("variant %s: annotation %s: %w", m.Variant, AnnotationArchs, err)
		}
	}
	switch m.Probe {
	case "", "torch", "cuda", "exec":
	default:
		return fmt.Errorf("variant %s: annotation %s=%q: want torch, cuda or exec", m.Variant, AnnotationProbe, m.Probe)
	}
	if m.Engine != "" && !validEngine(m.Engine) {
		return fmt.Errorf("annotation %s=%q: not an engine name", AnnotationEngine, m.Engine)
	}
	return nil
}

var engineRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

func validEngine(s string) bool { return engineRE.MatchString(s) }

// Annotations renders metadata as annotations (for publishing).
func (m Metadata) Annotations() map[string]string {
	out := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			out[k] = v
		}
	}
	set(AnnotationEngine, m.Engine)
	set(AnnotationEngineVersion, m.EngineVersion)
	set(AnnotationVariant, m.Variant)
	set(AnnotationCUDA, m.CUDA)
	set(AnnotationDriverMin, m.DriverMin)
	set(AnnotationArchs, m.Archs)
	set(AnnotationProbe, m.Probe)
	set(AnnotationProbeExec, m.ProbeExec)
	return out
}
