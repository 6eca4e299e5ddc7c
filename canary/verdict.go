package canary

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/provision"
)

// verdict reads node's GPUPinNode for key's outcome after since (the
// lease's acquisition, by the canary's own clock, as the status's time
// is): ok is false while the status shows none yet.
func (g *Gate) verdict(ctx context.Context, node, key string, since time.Time) (provision.CanaryVerdict, bool, error) {
	u, err := g.nodes.Resource(fleet.GPUPinNodes).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return provision.CanaryVerdict{}, false, fmt.Errorf("GPUPinNode %s: %w", node, err)
	}
	var n fleet.GPUPinNode
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &n); err != nil {
		return provision.CanaryVerdict{}, false, fmt.Errorf("GPUPinNode %s: %w", node, err)
	}
	return Verdict(n, key, since)
}

// Verdict is what a canary's status says of key after since: the variant
// it pinned, and those whose probe failed. A provision still under way,
// or one from before since, is no verdict.
func Verdict(n fleet.GPUPinNode, key string, since time.Time) (provision.CanaryVerdict, bool, error) {
	for _, e := range n.Status.Engines {
		if e.Key != key {
			continue
		}
		if e.At.Time.Before(since.Truncate(time.Second)) || (e.State != string(provision.Ready) && e.State != string(provision.Failed)) {
			return provision.CanaryVerdict{}, false, fmt.Errorf("GPUPinNode %s: %s is %s at %s, no outcome since %s", n.Name, key, e.State, e.At.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339))
		}
		v := provision.CanaryVerdict{Node: n.Name, Failed: map[string]string{}}
		if e.State == string(provision.Ready) {
			v.Passed = e.Variant
		}
		for _, f := range e.ProbeFailed {
			v.Failed[f.Variant] = f.Reason
		}
		return v, true, nil
	}
	return provision.CanaryVerdict{}, false, fmt.Errorf("GPUPinNode %s: no %s", n.Name, key)
}
