package build

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
)

// Spec is gpupin.yaml: one engine version and its variants.
type Spec struct {
	Engine  string `json:"engine"`
	Version string `json:"version"`
	// Repository is where --push publishes (registry/org/engine); the tag is
	// Repository:Version.
	Repository string        `json:"repository,omitempty"`
	Variants   []VariantSpec `json:"variants"`
}

// VariantSpec is one variant's image, for one or more platforms.
type VariantSpec struct {
	Name string `json:"name"`
	// CUDA is the CUDA version the variant targets (13.0); it becomes
	// CUDA_VERSION unless the base image or env sets it.
	CUDA string `json:"cuda"`
	// Base is an image reference, or "scratch".
	Base       string            `json:"base"`
	Platforms  []string          `json:"platforms"`
	Layers     []LayerSpec       `json:"layers,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Archs      string            `json:"archs,omitempty"`
}

// LayerSpec is one layer: a directory copied to Dest, or a tarball.
type LayerSpec struct {
	Dir  string `json:"dir,omitempty"`
	Dest string `json:"dest,omitempty"`
	Tar  string `json:"tar,omitempty"`
}

// LoadSpec reads and validates a spec file. Relative layer paths are made
// relative to the file's directory.
func LoadSpec(file string) (*Spec, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	s, err := ParseSpec(b, filepath.Dir(file))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

// ParseSpec parses and validates a spec; dir anchors relative paths.
func ParseSpec(b []byte, dir string) (*Spec, error) {
	var s Spec
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	for i := range s.Variants {
		for j := range s.Variants[i].Layers {
			l := &s.Variants[i].Layers[j]
			if l.Dir != "" && !filepath.IsAbs(l.Dir) {
				l.Dir = filepath.Join(dir, l.Dir)
			}
			if l.Tar != "" && !filepath.IsAbs(l.Tar) {
				l.Tar = filepath.Join(dir, l.Tar)
			}
		}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

var (
	versionRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate checks the spec; each error names its field (variants[1].cuda).
func (s *Spec) Validate() error {
	if s.Engine == "" {
		return fmt.Errorf("engine: required")
	}
	if err := images.CheckEngine(s.Engine); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if s.Version == "" {
		return fmt.Errorf("version: required")
	}
	if !versionRE.MatchString(s.Version) {
		return fmt.Errorf("version: %q cannot be a tag (letters, digits, '_', '.', '-'; at most 128)", s.Version)
	}
	if s.Repository != "" {
		if _, err := name.NewRepository(s.Repository); err != nil {
			return fmt.Errorf("repository: %w", err)
		}
	}
	if len(s.Variants) == 0 {
		return fmt.Errorf("variants: at least one is required")
	}
	names := map[string]int{}
	for i := range s.Variants {
		if err := s.Variants[i].validate(); err != nil {
			return fmt.Errorf("variants[%d].%w", i, err)
		}
		n := s.Variants[i].Name
		if j, ok := names[n]; ok {
			return fmt.Errorf("variants[%d].name: %s is already variants[%d]", i, n, j)
		}
		names[n] = i
	}
	return nil
}

// fieldError lets Validate prefix the variant's index: "variants[1]." + "cuda: …".
type fieldError struct{ msg string }

func (e fieldError) Error() string { return e.msg }

func ferr(format string, a ...any) error { return fieldError{fmt.Sprintf(format, a...)} }

func (v *VariantSpec) validate() error {
	if v.Name == "" {
		return ferr("name: required")
	}
	if !images.ValidVariantName(v.Name) {
		return ferr("name: %q is not a variant name (lower-case letters, digits, '.', '_' or '-', e.g. cu129)", v.Name)
	}
	if v.CUDA == "" {
		return ferr("cuda: required (the CUDA version the variant targets, e.g. 13.0)")
	}
	mm, err := images.ParseCUDAVersion(v.CUDA)
	if err != nil {
		return ferr("cuda: %v", err)
	}
	c, err := cudaClaim(v.Name)
	if err != nil {
		return ferr("name: %v", err)
	}
	if !c.holds(versionOf(mm)) {
		return ferr("cuda: %s, but the name %s claims CUDA %s", v.CUDA, v.Name, c)
	}
	if v.Base == "" {
		return ferr("base: required (an image reference, or scratch)")
	}
	if v.Base != "scratch" {
		if _, err := name.ParseReference(v.Base); err != nil {
			return ferr("base: %v", err)
		}
	}
	if len(v.Platforms) == 0 {
		return ferr("platforms: at least one is required (e.g. linux/amd64)")
	}
	seen := map[string]bool{}
	for i, p := range v.Platforms {
		pl, err := v1.ParsePlatform(p)
		if err != nil || pl.OS == "" || pl.Architecture == "" || strings.Count(p, "/") < 1 {
			return ferr("platforms[%d]: %q: want os/arch[/variant], e.g. linux/arm64", i, p)
		}
		if seen[pl.String()] {
			return ferr("platforms[%d]: %s is given twice", i, p)
		}
		seen[pl.String()] = true
	}
	for i, l := range v.Layers {
		switch {
		case l.Dir != "" && l.Tar != "":
			return ferr("layers[%d]: give dir or tar, not both", i)
		case l.Dir != "":
			st, err := os.Stat(l.Dir)
			if err != nil {
				return ferr("layers[%d].dir: %v", i, err)
			}
			if !st.IsDir() {
				return ferr("layers[%d].dir: %s is not a directory", i, l.Dir)
			}
			if l.Dest == "" || !path.IsAbs(l.Dest) {
				return ferr("layers[%d].dest: %q: want an absolute path in the image, e.g. /opt/engine", i, l.Dest)
			}
			if path.Clean(l.Dest) != l.Dest && path.Clean(l.Dest)+"/" != l.Dest {
				return ferr("layers[%d].dest: %q: not a clean path", i, l.Dest)
			}
		case l.Tar != "":
			if l.Dest != "" {
				return ferr("layers[%d].dest: a tar layer is unpacked at /; dest applies to dir only", i)
			}
			st, err := os.Stat(l.Tar)
			if err != nil {
				return ferr("layers[%d].tar: %v", i, err)
			}
			if !st.Mode().IsRegular() {
				return ferr("layers[%d].tar: %s is not a file", i, l.Tar)
			}
		default:
			return ferr("layers[%d]: give dir (with dest) or tar", i)
		}
	}
	for k := range v.Env {
		if !envKeyRE.MatchString(k) {
			return ferr("env.%s: not an environment variable name", k)
		}
	}
	if cv, ok := v.Env["CUDA_VERSION"]; ok {
		emm, err := images.ParseCUDAVersion(cv)
		if err != nil || emm != mm {
			return ferr("env.CUDA_VERSION: %q contradicts cuda: %s", cv, v.CUDA)
		}
	}
	for k, val := range v.Labels {
		if k == "" {
			return ferr("labels: empty key")
		}
		switch k {
		case images.AnnotationProbe:
			if val != "torch" && val != "cuda" && val != "exec" {
				return ferr("labels.%s: %q: want torch, cuda or exec", k, val)
			}
		case images.AnnotationVariant:
			if val != v.Name {
				return ferr("labels.%s: %q contradicts name %s", k, val, v.Name)
			}
		case images.AnnotationArchs:
			if _, err := images.ParseArchs(val); err != nil {
				return ferr("labels.%s: %v", k, err)
			}
		}
	}
	if v.Archs != "" {
		if _, err := images.ParseArchs(v.Archs); err != nil {
			return ferr("archs: %v", err)
		}
	}
	return nil
}

func versionOf(s string) node.Version {
	v, _ := node.ParseVersion(s)
	return v
}
