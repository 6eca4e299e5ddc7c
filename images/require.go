package images

import (
	"fmt"
	"sort"
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

// ParseRequireVar parses the value of one NVIDIA_REQUIRE_* variable.
func ParseRequireVar(name, value string) (RequireVar, error) {
	if len(value) > maxRequire {
		return RequireVar{}, fmt.Errorf("%s: %d bytes, more than %d", name, len(value), maxRequire)
	}
	v := RequireVar{Name: name, Raw: value}
	for _, alt := range strings.Fields(value) {
		var and []Constraint
		for _, term := range strings.Split(alt, ",") {
			if term == "" {
				return RequireVar{}, fmt.Errorf("%s: empty constraint in %q", name, alt)
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

// RequirementsFromEnv reads the constraints from an image config's Env. An
// image with CUDA_VERSION and no NVIDIA_REQUIRE_CUDA requires cuda>=major.minor,
// as libnvidia-container assumes. NVIDIA_DISABLE_REQUIRE turns the check off
// (nil, nil).
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
		if strings.HasPrefix(k, "NVIDIA_REQUIRE_") {
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
	if _, ok := vars["NVIDIA_REQUIRE_CUDA"]; !ok {
		if cv, ok := vars["CUDA_VERSION"]; ok {
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

func isTrue(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
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

func (v RequireVar) holds(f *node.Facts, g node.GPU) bool {
	for _, alt := range v.Alternatives {
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
	}
	return false
}

func (c Constraint) holds(f *node.Facts, g node.GPU) bool {
	switch c.Key {
	case "brand":
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
	main := v.Alternatives[0]
	var failed []string
	for _, c := range main {
		if !c.holds(f, g) {
			failed = append(failed, c.String())
		}
	}
	s := fmt.Sprintf("driver %s supports CUDA %s; %s needs %s", f.Driver, f.CUDA, v.Name, strings.Join(failed, ","))
	if n := len(v.Alternatives) - 1; n > 0 {
		brand := g.Brand
		if brand == "" {
			brand = "unknown"
		}
		s += fmt.Sprintf(", and none of its %d brand/driver branches matches GPU %d (brand %s, driver %s)", n, g.Index, brand, f.Driver)
	}
	return s
}

func parseVersion(s string) (node.Version, error) { return node.ParseVersion(s) }
