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
	// AnnotationRequire carries the image's NVIDIA_REQUIRE_* set (with
	// CUDA_VERSION and NVIDIA_DISABLE_REQUIRE, which change its meaning)
	// as a JSON object of the config's variables, so a published entry is
	// judged exactly as the image itself would be: brand/driver branches
	// and arch requirements included.
	AnnotationRequire = "io.gpupin.cuda.require"
	// AnnotationProbeExec is also read as an image label: the exec probe's argv, JSON.
	AnnotationProbeExec = "io.gpupin.probe.exec"
)

// maxAnnotation bounds one value: metadata is a few dozen bytes, and a
// registry that sends megabytes is not to be believed. The requirement set
// of an nvidia/cuda base is about 2 KiB of brand branches, so it gets more.
const (
	maxAnnotation        = 4096
	maxRequireAnnotation = 16 << 10
)

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
	// Require is the io.gpupin.cuda.require JSON, as RequireAnnotation
	// writes it; "" when the publisher carried none.
	Require string `json:"require,omitempty"`
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
		limit := maxAnnotation
		if k == AnnotationRequire {
			limit = maxRequireAnnotation
		}
		if len(v) > limit {
			return Metadata{}, fmt.Errorf("annotation %s: %d bytes, more than %d", k, len(v), limit)
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
		Require:       strings.TrimSpace(ann[AnnotationRequire]),
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
		return fmt.Errorf("annotation %s: %w", AnnotationEngine, CheckEngine(m.Engine))
	}
	if m.EngineVersion != "" && !ValidEngineVersion(m.EngineVersion) {
		return fmt.Errorf("annotation %s=%q: not an engine version (letters, digits, '.', '_', '+' or '-', at most 128, as a tag is)", AnnotationEngineVersion, m.EngineVersion)
	}
	if m.Require != "" {
		if _, _, err := ParseRequireAnnotation(m.Require); err != nil {
			return fmt.Errorf("variant %s: annotation %s: %w", m.Variant, AnnotationRequire, err)
		}
	}
	return nil
}

// Requirements evaluates the carried requirement set: nil when none was
// carried; disabled when the image turned the check off.
func (m Metadata) Requirements() (req *Requirements, disabled bool, err error) {
	if m.Require == "" {
		return nil, false, nil
	}
	return ParseRequireAnnotation(m.Require)
}

var (
	engineRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$`)
)

func validEngine(s string) bool { return engineRE.MatchString(s) }

// ValidEngineVersion reports whether s can be an engine version: what a
// tag may hold (letters, digits, '_', '.', '-'), and '+' for build
// metadata, at most 128 bytes. It is checked before anything is pulled,
// since it names the pin.
func ValidEngineVersion(s string) bool { return versionRE.MatchString(s) }

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
	set(AnnotationRequire, m.Require)
	return out
}
