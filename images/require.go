package images

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gpupin/gpupin/node"
)

// Requirements are an image's NVIDIA_REQUIRE_* constraints, evaluated as
// libnvidia-container does: each variable is a list of space-separated
// alternatives (OR), each alternative comma-joined constraints (AND), and
// all variables must hold (AND). Under CDI nothing else enforces them.
type Requirements struct {
	Vars []RequireVar
}

// RequireVar is one NVIDIA_REQUIRE_* variable.
type RequireVar struct {
	Name         string
	Raw          string
	Alternatives [][]Constraint
}

// Constraint is one key-op-value term: cuda>=12.9, brand=tesla, arch>=7.5.
type Constraint struct {
	Key   string // cuda, driver, arch, brand
	Op    string // = == != < <= > >=
	Value string
}

func (c Constraint) String() string { return c.Key + c.Op + c.Value }

const maxRequire = 8192

// ParseRequireVar parses the value of one NVIDIA_REQUIRE_* variable. As in
// libnvidia-container, empty terms (",,", a trailing comma) are skipped; an
// alternative made only of commas is kept, empty, because it changes the
// outcome (see holds).
func ParseRequireVar(name, value string) (RequireVar, error) {
	if len(value) > maxRequire {
		return RequireVar{}, fmt.Errorf("%s: %d bytes, more than %d", name, len(value), maxRequire)
	}
	v := RequireVar{Name: name, Raw: value}
	for _, alt := range strings.Fields(value) {
		and := []Constraint{}
		for _, term := range strings.Split(alt, ",") {
			if term == "" {
				continue
			}
			c, err := parseConstraint(term)
			if err != nil {
				return RequireVar{}, fmt.Errorf("%s: %w", name, err)
			}
			and = append(and, c)
		}
		v.Alternatives = append(v.Alternatives, and)
	}
	return v, nil
}

func parseConstraint(term string) (Constraint, error) {
	i := strings.IndexAny(term, "<>=!")
	if i <= 0 {
		return Constraint{}, fmt.Errorf("constraint %q: want key, operator and value, e.g. cuda>=12.9", term)
	}
	key := strings.ToLower(term[:i])
	rest := term[i:]
	var op string
	for _, o := range []string{"<=", ">=", "==", "!=", "<", ">", "="} {
		if strings.HasPrefix(rest, o) {
			op = o
			break
		}
	}
	if op == "" {
		return Constraint{}, fmt.Errorf("constraint %q: unknown operator", term)
	}
	val := rest[len(op):]
	if val == "" || strings.ContainsAny(val, "<>=!") {
		return Constraint{}, fmt.Errorf("constraint %q: bad value", term)
	}
	c := Constraint{Key: key, Op: op, Value: val}
	switch key {
	case "cuda", "driver":
		if _, err := node.ParseVersion(val); err != nil {
			return Constraint{}, fmt.Errorf("constraint %q: %w", term, err)
		}
	case "arch":
		if _, err := node.ParseCC(val); err != nil {
			return Constraint{}, fmt.Errorf("constraint %q: %w", term, err)
		}
	case "brand":
		if op != "=" && op != "==" && op != "!=" {
			return Constraint{}, fmt.Errorf("constraint %q: brand takes = or !=", term)
		}
		c.Value = strings.ToLower(val)
	default:
		return Constraint{}, fmt.Errorf("constraint %q: unknown key %q (want cuda, driver, arch or brand)", term, key)
	}
	return c, nil
}

// RequirementsFromEnv reads the constraints from an image config's Env, as
// the NVIDIA Container Toolkit collects them: every NVIDIA_REQUIRE_* variable
// except NVIDIA_REQUIRE_JETPACK*, and, for an image with CUDA_VERSION and no
// (or an empty) NVIDIA_REQUIRE_CUDA, cuda>=major.minor. NVIDIA_DISABLE_REQUIRE
// set to a true value (strconv.ParseBool) turns the check off: (nil, nil).
func RequirementsFromEnv(env []string) (*Requirements, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	if d, ok := vars["NVIDIA_DISABLE_REQUIRE"]; ok && isTrue(d) {
		return nil, nil
	}
	var names []string
	for k := range vars {
		if strings.HasPrefix(k, "NVIDIA_REQUIRE_") && !strings.HasPrefix(k, "NVIDIA_REQUIRE_JETPACK") {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	r := &Requirements{}
	for _, n := range names {
		v, err := ParseRequireVar(n, vars[n])
		if err != nil {
			return nil, err
		}
		if len(v.Alternatives) > 0 {
			r.Vars = append(r.Vars, v)
		}
	}
	if vars["NVIDIA_REQUIRE_CUDA"] == "" {
		if cv := vars["CUDA_VERSION"]; cv != "" {
			ver, err := node.ParseVersion(cv)
			if err != nil {
				return nil, fmt.Errorf("CUDA_VERSION: %w", err)
			}
			mm := majorMinor(ver)
			r.Vars = append(r.Vars, RequireVar{Name: "NVIDIA_REQUIRE_CUDA", Raw: "cuda>=" + mm,
				Alternatives: [][]Constraint{{{Key: "cuda", Op: ">=", Value: mm}}}})
		}
	}
	return r, nil
}

// isTrue reads a boolean as the toolkit does (strconv.ParseBool); anything
// unreadable is false.
func isTrue(s string) bool {
	b, err := strconv.ParseBool(s)
	return err == nil && b
}

func majorMinor(v node.Version) string {
	if len(v) == 1 {
		return fmt.Sprintf("%d.0", v[0])
	}
	return fmt.Sprintf("%d.%d", v[0], v[1])
}

// Check evaluates the requirements on a node. Arch and brand are per GPU, as
// libnvidia-container evaluates them per device: every GPU must satisfy every
// variable. The reason, when not met, says which GPU and which variable.
func (r *Requirements) Check(f *node.Facts) (bool, string) {
	if r == nil {
		return true, ""
	}
	for _, v := range r.Vars {
		for _, g := range f.GPUs {
			if !v.holds(f, g) {
				return false, v.reason(f, g)
			}
		}
	}
	return true, ""
}

// MinCUDA returns the lowest CUDA version the main branch (the alternative
// without brand/driver terms) needs, for display: "" when none.
func (r *Requirements) MinCUDA() string {
	if r == nil {
		return ""
	}
	for _, v := range r.Vars {
		for _, alt := range v.Alternatives {
			for _, c := range alt {
				if c.Key == "cuda" && (c.Op == ">=" || c.Op == ">") {
					return c.Value
				}
			}
		}
	}
	return ""
}

// holds evaluates the variable for one GPU the way libnvidia-container's
// dsl_evaluate does: alternatives in order, each an AND of its terms; the
// first that holds wins. An alternative with no terms stops the evaluation
// with the result of the last term evaluated (true if none was), which is
// what its loop does.
func (v RequireVar) holds(f *node.Facts, g node.GPU) bool {
	last := true
	for _, alt := range v.Alternatives {
		if len(alt) == 0 {
			return last
		}
		ok := true
		for _, c := range alt {
			if !c.holds(f, g) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
		last = false
	}
	return last
}

func (c Constraint) holds(f *node.Facts, g node.GPU) bool {
	switch c.Key {
	case "brand":
		if g.Brand == "" {
			// Unknown to us (facts without a brand): match no brand term
			// either way, so no forward-compatibility branch is taken on a guess.
			return false
		}
		eq := strings.EqualFold(g.Brand, c.Value)
		if c.Op == "!=" {
			return !eq
		}
		return eq
	case "arch":
		have, err1 := node.ParseCC(g.CC)
		want, err2 := node.ParseCC(c.Value)
		if err1 != nil || err2 != nil {
			return false
		}
		return compare(node.Version{have.Major, have.Minor}.Compare(node.Version{want.Major, want.Minor}), c.Op)
	case "cuda", "driver":
		s := f.CUDA
		if c.Key == "driver" {
			s = f.Driver
		}
		have, err1 := node.ParseVersion(s)
		want, err2 := node.ParseVersion(c.Value)
		if err1 != nil || err2 != nil {
			return false
		}
		return compare(have.Compare(want), c.Op)
	}
	return false
}

func compare(cmp int, op string) bool {
	switch op {
	case "=", "==":
		return cmp == 0
	case "!=":
		return cmp != 0
	case "<":
		return cmp < 0
	case "<=":
		return cmp <= 0
	case ">":
		return cmp > 0
	case ">=":
		return cmp >= 0
	}
	return false
}

func (v RequireVar) reason(f *node.Facts, g node.GPU) string {
	// The first alternative is the main branch (cuda>=X); the rest are
	// forward-compatibility branches for datacenter brands.
	var main []Constraint
	if len(v.Alternatives) > 0 {
		main = v.Alternatives[0]
	}
	var failed []string
	facts := map[string]string{}
	for _, c := range main {
		if c.holds(f, g) {
			continue
		}
		failed = append(failed, c.String())
		switch c.Key {
		case "cuda":
			facts["cuda"] = fmt.Sprintf("driver %s supports CUDA %s", f.Driver, f.CUDA)
		case "driver":
			facts["driver"] = fmt.Sprintf("the driver is %s", f.Driver)
		case "arch":
			facts["arch"] = fmt.Sprintf("GPU %d (%s) has compute capability %s", g.Index, g.Name, g.CC)
		case "brand":
			facts["brand"] = fmt.Sprintf("GPU %d is of brand %s", g.Index, brandOf(g))
		}
	}
	var said []string
	for _, k := range []string{"cuda", "driver", "arch", "brand"} {
		if s, ok := facts[k]; ok {
			said = append(said, s)
		}
	}
	if len(failed) == 0 {
		failed = []string{v.Raw}
		said = []string{fmt.Sprintf("driver %s (CUDA %s), GPU %d (%s, compute capability %s, brand %s)", f.Driver, f.CUDA, g.Index, g.Name, g.CC, brandOf(g))}
	}
	s := fmt.Sprintf("%s; %s needs %s", strings.Join(said, ", "), v.Name, strings.Join(failed, ","))
	if n := len(v.Alternatives) - 1; n > 0 {
		s += fmt.Sprintf(", and none of its %d brand/driver branches matches GPU %d (brand %s, driver %s)", n, g.Index, brandOf(g), f.Driver)
	}
	if _, ok := facts["cuda"]; ok {
		s += ": upgrade the driver or use a variant built for an older CUDA"
	}
	return s
}

func brandOf(g node.GPU) string {
	if g.Brand == "" {
		return "unknown"
	}
	return g.Brand
}

// requireVars are the config variables that decide an image's requirements.
func isRequireVar(k string) bool {
	return k == "CUDA_VERSION" || k == "NVIDIA_DISABLE_REQUIRE" ||
		(strings.HasPrefix(k, "NVIDIA_REQUIRE_") && !strings.HasPrefix(k, "NVIDIA_REQUIRE_JETPACK"))
}

// RequireAnnotation is the io.gpupin.cuda.require value for an image
// config's Env: its requirement variables as a JSON object (keys sorted),
// or "" when it has none. Evaluating it gives what RequirementsFromEnv
// gives for the image itself.
func RequireAnnotation(env []string) (string, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if isRequireVar(k) {
			vars[k] = v
		}
	}
	if len(vars) == 0 {
		return "", nil
	}
	if _, err := RequirementsFromEnv(env); err != nil {
		return "", err
	}
	// Written as people read it (cuda>=12.9, not cuda\u003e=12.9): it is
	// shown by crane, skopeo and registries' UIs as it is.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(vars); err != nil {
		return "", err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > maxRequireAnnotation {
		return "", fmt.Errorf("requirement variables of %d bytes: more than %d", len(b), maxRequireAnnotation)
	}
	return string(b), nil
}

// ParseRequireAnnotation reads an io.gpupin.cuda.require value back into
// the requirements, exactly as RequirementsFromEnv reads the image's own
// Env. disabled is true when the image set NVIDIA_DISABLE_REQUIRE.
func ParseRequireAnnotation(s string) (req *Requirements, disabled bool, err error) {
	var vars map[string]string
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&vars); err != nil {
		return nil, false, fmt.Errorf("want a JSON object of NVIDIA_REQUIRE_* variables: %w", err)
	}
	if dec.More() {
		return nil, false, fmt.Errorf("want one JSON object, found more")
	}
	if len(vars) == 0 {
		return nil, false, fmt.Errorf("empty requirement set")
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		if !isRequireVar(k) {
			return nil, false, fmt.Errorf("%q is not a requirement variable (NVIDIA_REQUIRE_*, NVIDIA_DISABLE_REQUIRE, CUDA_VERSION)", k)
		}
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	req, err = RequirementsFromEnv(env)
	if err != nil {
		return nil, false, err
	}
	return req, req == nil, nil
}
