package images

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gpupin/gpupin/node"
)

// Outcomes of a plan.
const (
	OutcomeReady       = "ready-to-provision"
	OutcomeNone        = "none"
	OutcomeUnsupported = "unsupported"
	OutcomeNoCandidate = "no-candidate"
)

// Plan is what a node would get from a reference, and why.
type Plan struct {
	Ref        string      `json:"ref"`
	Node       *node.Facts `json:"node"`
	Simulated  bool        `json:"simulated"`
	Override   string      `json:"override"`
	Candidates []Candidate `json:"candidates"`
	Rejected   []Rejection `json:"rejected"`
	Outcome    string      `json:"outcome"`
	Detail     string      `json:"detail,omitempty"`
}

// Candidate is a variant to try, in order.
type Candidate struct {
	Variant  string `json:"variant"`
	CUDA     string `json:"cuda"`
	Ref      string `json:"ref"`
	Platform string `json:"platform"`
	Derived  bool   `json:"derived"`
	// MediaType is the index entry's: what the pull must find there.
	MediaType string `json:"media_type,omitempty"`
	// Warning is set on a forced variant that auto would have rejected.
	Warning string `json:"warning,omitempty"`
	// Probe is the probe that would prove it: provision.Plan sets it, since
	// it depends on the engine's name as well as the variant's metadata.
	Probe string   `json:"probe,omitempty"`
	Meta  Metadata `json:"-"`
}

// Rejection says why a variant is not a candidate, in words a person can act on.
type Rejection struct {
	Variant  string `json:"variant"`
	Platform string `json:"platform,omitempty"`
	Reason   string `json:"reason"`
}

// Choose picks the candidates for a node. For an image override, the caller
// resolves the override's reference and passes its set: the operator's
// image still has to suit the node, and is still probed.
func Choose(f *node.Facts, set *Set, ov Override) *Plan {
	p := &Plan{Ref: set.Ref, Node: f, Simulated: f.Simulated, Override: ov.String(),
		Candidates: []Candidate{}, Rejected: []Rejection{}}
	if !f.Supported() {
		p.Outcome, p.Detail = OutcomeUnsupported, "unsupported: "+f.Unsupported
		return p
	}
	if ov.Kind == OverrideNone {
		p.Outcome, p.Detail = OutcomeNone, "override is none: this node does not run this engine"
		return p
	}
	var onPlatform []Variant
	seen := map[string]bool{}
	var valid []Variant
	for _, v := range set.Variants {
		if v.Invalid != "" {
			// Invalid begins with the entry's name ("entry 2 (sha256:…): …"),
			// which is the rejection's variant: said once, before the reason.
			p.Rejected = append(p.Rejected, Rejection{Variant: v.Variant, Platform: v.Platform,
				Reason: "unreadable metadata, skipped " + strings.TrimPrefix(v.Invalid, v.Variant+" ") + "; ask its publisher to fix the index"})
			continue
		}
		valid = append(valid, v)
	}
	set = &Set{Ref: set.Ref, Repo: set.Repo, Digest: set.Digest, MediaType: set.MediaType, Variants: valid}
	for _, v := range set.Variants {
		if PlatformMatches(v.Platform, f.Platform) {
			onPlatform = append(onPlatform, v)
			seen[v.Variant] = true
		}
	}
	for _, v := range set.Variants {
		if !seen[v.Variant] {
			seen[v.Variant] = true
			p.Rejected = append(p.Rejected, Rejection{Variant: v.Variant, Platform: v.Platform,
				Reason: fmt.Sprintf("published for %s only, not for this node's %s: publish it for %s or use another image", platformsOf(set, v.Variant), f.Platform, f.Platform)})
		}
	}

	if ov.Kind == OverrideVariant {
		for _, v := range onPlatform {
			if v.Variant == ov.Variant {
				c := candidate(v)
				if reason := Reject(f, v); reason != "" {
					c.Warning = "forced by override; auto would reject it: " + reason
				}
				p.Candidates = append(p.Candidates, c)
				break
			}
		}
		if len(p.Candidates) == 0 {
			p.Outcome = OutcomeNoCandidate
			p.Detail = fmt.Sprintf("override %s: no such variant for %s under %s; published: %s", ov.Variant, f.Platform, set.Ref, strings.Join(variantNames(onPlatform), ", "))
			return p
		}
		p.Outcome = OutcomeReady
		return p
	}

	for _, v := range onPlatform {
		if reason := Reject(f, v); reason != "" {
			p.Rejected = append(p.Rejected, Rejection{Variant: v.Variant, Platform: v.Platform, Reason: reason})
			continue
		}
		p.Candidates = append(p.Candidates, candidate(v))
	}
	// Newest CUDA first; among equals, the publisher's order.
	sort.SliceStable(p.Candidates, func(i, j int) bool {
		a, _ := node.ParseVersion(p.Candidates[i].CUDA)
		b, _ := node.ParseVersion(p.Candidates[j].CUDA)
		return a.Compare(b) > 0
	})
	if len(p.Candidates) == 0 {
		p.Outcome = OutcomeNoCandidate
		p.Detail = "no variant of " + set.Ref + " can run on this node"
		if len(onPlatform) == 0 {
			p.Detail = fmt.Sprintf("%s has no image for %s", set.Ref, f.Platform)
		}
		return p
	}
	p.Outcome = OutcomeReady
	return p
}

func candidate(v Variant) Candidate {
	return Candidate{Variant: v.Variant, CUDA: v.CUDA, Ref: v.Ref, Platform: v.Platform, Derived: v.Derived, MediaType: v.MediaType, Meta: v.Metadata}
}

// Reject returns why a variant cannot run on the node, or "". The reason
// does not name the variant: a rejection is printed after it.
//
// An entry with a requirement set (derived from the image's config, or
// carried by io.gpupin.cuda.require) is judged by that set alone, as
// libnvidia-container would judge the image: the forward-compatibility
// branches may admit a driver older than the CUDA version, so neither the
// CUDA version nor io.gpupin.cuda.driver.min (the main branch's driver
// term) is applied on top. Published and upstream images of the same
// config so get the same answer on every node.
func Reject(f *node.Facts, v Variant) string {
	nodeCUDA, err := node.ParseVersion(f.CUDA)
	if err != nil {
		return fmt.Sprintf("node CUDA version %q unreadable", f.CUDA)
	}
	need, err := node.ParseVersion(v.CUDA)
	if err != nil {
		return fmt.Sprintf("CUDA version %q unreadable", v.CUDA)
	}
	// The driver reports CUDA as major.minor; a build of 12.9.1 runs where
	// 12.9 does (patch releases share the driver requirement).
	if len(need) > 2 {
		need = need[:2]
	}
	switch {
	case v.Require != nil:
		if ok, why := v.Require.Check(f); !ok {
			return why
		}
	case v.RequireDisabled:
		// The image turned the check off (NVIDIA_DISABLE_REQUIRE); the probe
		// still decides whether it runs.
	default:
		if nodeCUDA.Compare(need) < 0 {
			return fmt.Sprintf("driver %s supports CUDA %s; this variant needs %s: upgrade the driver or use a variant built for CUDA ≤ %s", f.Driver, f.CUDA, v.CUDA, f.CUDA)
		}
		if v.DriverMin != "" {
			have, _ := node.ParseVersion(f.Driver)
			min, _ := node.ParseVersion(v.DriverMin)
			if have.Compare(min) < 0 {
				return fmt.Sprintf("driver %s is older than %s, the lowest this variant supports: upgrade the driver", f.Driver, v.DriverMin)
			}
		}
	}
	if v.Archs != "" {
		archs, err := ParseArchs(v.Archs)
		if err != nil {
			return fmt.Sprintf("arch list unreadable: %v", err)
		}
		for _, g := range f.GPUs {
			cc, err := node.ParseCC(g.CC)
			if err != nil {
				return fmt.Sprintf("GPU %d: compute capability %q unreadable", g.Index, g.CC)
			}
			if !archs.Covers(cc) {
				return fmt.Sprintf("no kernels for GPU %d (%s, compute capability %s): its archs are %s; use a variant built for %s", g.Index, g.Name, g.CC, archs, g.CC)
			}
		}
	}
	return ""
}

func variantNames(vs []Variant) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Variant)
	}
	if len(out) == 0 {
		return []string{"(none)"}
	}
	return out
}

func platformsOf(set *Set, variant string) string {
	var out []string
	for _, v := range set.Variants {
		if v.Variant == variant {
			out = append(out, v.Platform)
		}
	}
	return strings.Join(out, ", ")
}
