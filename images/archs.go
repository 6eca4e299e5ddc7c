package images

import (
	"fmt"
	"strings"

	"github.com/gpupin/gpupin/node"
)

// Arch is one entry of an arch list: SASS for a capability, and PTX too when
// marked +PTX.
type Arch struct {
	CC  node.CC
	PTX bool
	// Specific marks arch-specific SASS (9.0a): it runs on that capability only.
	Specific bool
}

// Archs lists the capabilities a build has kernels for.
type Archs []Arch

// ParseArchs reads "7.5,8.0,8.6,9.0,12.0+PTX"; commas, semicolons and spaces
// all separate, so TORCH_CUDA_ARCH_LIST ("7.5 8.0 9.0a 12.0+PTX") reads too.
func ParseArchs(s string) (Archs, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' || r == ' ' || r == '\t' })
	if len(fields) == 0 {
		return nil, fmt.Errorf("empty arch list")
	}
	if len(fields) > 64 {
		return nil, fmt.Errorf("arch list of %d entries: too many", len(fields))
	}
	out := make(Archs, 0, len(fields))
	for _, f := range fields {
		a := Arch{}
		v := f
		if cut, ok := strings.CutSuffix(v, "+PTX"); ok {
			a.PTX, v = true, cut
		}
		if cut, ok := strings.CutSuffix(v, "a"); ok {
			a.Specific, v = true, cut
		} else if cut, ok := strings.CutSuffix(v, "f"); ok {
			v = cut // family SASS runs on later minors of the major, as plain SASS does
		}
		cc, err := node.ParseCC(v)
		if err != nil {
			return nil, fmt.Errorf("arch %q: want X.Y or X.Y+PTX", f)
		}
		a.CC = cc
		out = append(out, a)
	}
	return out, nil
}

// Covers reports whether the build runs on a GPU of capability cc: SASS for
// the same major with a minor ≤ the GPU's (binary compatibility within a
// major), or PTX for any capability ≤ the GPU's (the driver JITs it).
func (as Archs) Covers(cc node.CC) bool {
	for _, a := range as {
		// PTX of an arch-specific target (compute_90a) is not forward
		// compatible: it JITs on that capability only, as its SASS runs.
		if a.PTX && !a.Specific && !cc.Less(a.CC) {
			return true
		}
		if a.Specific {
			if a.CC == cc {
				return true
			}
			continue
		}
		if a.CC.Major == cc.Major && a.CC.Minor <= cc.Minor {
			return true
		}
	}
	return false
}

func (as Archs) String() string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.CC.String()
		if a.Specific {
			s[i] += "a"
		}
		if a.PTX {
			s[i] += "+PTX"
		}
	}
	return strings.Join(s, ",")
}
