package fleet

import (
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpupin/gpupin/images"
)

// Level is an EngineOverride's precedence on a node: the one that names
// the node beats the ones whose selector picks it, which beat the
// cluster-wide ones; any of them beats the node's overrides file.
type Level int

// The levels, lowest first.
const (
	LevelCluster Level = iota + 1
	LevelGroup
	LevelNode
)

func (l Level) String() string {
	switch l {
	case LevelNode:
		return "node"
	case LevelGroup:
		return "group"
	case LevelCluster:
		return "cluster"
	}
	return "none"
}

// LevelOf is the level an override has, and whether it applies to a node
// with this name and these labels. A selector that does not parse applies
// to no node (and is reported by Resolve).
func LevelOf(o *EngineOverride, nodeName string, nodeLabels map[string]string) (Level, bool, error) {
	switch {
	case o.Spec.NodeName != "":
		return LevelNode, o.Spec.NodeName == nodeName, nil
	case o.Spec.NodeSelector != nil:
		sel, err := metav1.LabelSelectorAsSelector(o.Spec.NodeSelector)
		if err != nil {
			return LevelGroup, false, fmt.Errorf("nodeSelector: %w", err)
		}
		return LevelGroup, sel.Matches(labels.Set(nodeLabels)), nil
	}
	return LevelCluster, true, nil
}

// Resolution is the EngineOverride that decides an engine's choice on a
// node.
type Resolution struct {
	Engine string
	Choice string
	// Name is the winning EngineOverride's, Level its precedence.
	Name  string
	Level Level
	// Shadowed are the other overrides at the same level that also apply,
	// in the order they lost: the first by name wins a tie.
	Shadowed []string
	// Err is set when Choice is not auto, none, a variant or an image
	// reference: the node keeps its last good choice and reports it.
	Err error
}

// Source names where the choice comes from, for plan, status and Events.
func (r Resolution) Source() string {
	return fmt.Sprintf("EngineOverride %s (%s)", r.Name, r.Level)
}

// Resolve picks, per engine, the EngineOverride that decides it on the
// node: the highest level that applies, and at one level the first by
// name (deterministic, and reported in Shadowed). An engine no override
// applies to is absent: the node's own file decides it. Overrides whose
// selector does not parse come back as rejections.
func Resolve(ovs []EngineOverride, nodeName string, nodeLabels map[string]string) (map[string]Resolution, []OverrideRejection) {
	sorted := append([]EngineOverride(nil), ovs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	out := map[string]Resolution{}
	var bad []OverrideRejection
	for i := range sorted {
		o := &sorted[i]
		lvl, applies, err := LevelOf(o, nodeName, nodeLabels)
		if err != nil {
			bad = append(bad, OverrideRejection{Engine: o.Spec.Engine, Source: "EngineOverride " + o.Name, Choice: o.Spec.Choice, Reason: err.Error()})
			continue
		}
		if !applies {
			continue
		}
		cur, ok := out[o.Spec.Engine]
		switch {
		case !ok || lvl > cur.Level:
			r := Resolution{Engine: o.Spec.Engine, Choice: o.Spec.Choice, Name: o.Name, Level: lvl}
			// Checked as every override is (the file's, the API's).
			_, r.Err = images.ParseOverrides(map[string]string{o.Spec.Engine: o.Spec.Choice})
			out[o.Spec.Engine] = r
		case lvl == cur.Level:
			cur.Shadowed = append(cur.Shadowed, o.Name)
			out[o.Spec.Engine] = cur
		}
	}
	return out, bad
}
