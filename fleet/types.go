// Package fleet is gpupin's fleet layer on the Kubernetes API: operators'
// choices kept as EngineOverride objects (gpupin.io/v1alpha1), resolved
// per node by precedence (node > group > cluster > the node's file), an
// informer-driven watcher that hands a node agent its effective overrides
// within a moment of a change and keeps the last known ones through an API
// outage, a writer of the node's GPUPinNode status, and Events on the Node
// for each state change. docs/fleet.md has the design.
//
// The objects are read and written through client-go's dynamic client and
// converted to the plain structs here: no generated clientset.
package fleet

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of gpupin's API.
const (
	Group   = "gpupin.io"
	Version = "v1alpha1"
)

// The resources, for the dynamic client.
var (
	EngineOverrides = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "engineoverrides"}
	GPUPinNodes     = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "gpupinnodes"}
)

// EngineOverride is an operator's choice for one engine, on one node
// (spec.nodeName), on the nodes a label selector picks (spec.nodeSelector),
// or cluster-wide (neither). Cluster-scoped.
type EngineOverride struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              EngineOverrideSpec `json:"spec"`
}

// EngineOverrideSpec is what an EngineOverride chooses, and where.
type EngineOverrideSpec struct {
	// Engine is the engine's name (io.gpupin.engine, else the image
	// repository's last element), as the node's overrides file names it.
	Engine string `json:"engine"`
	// Choice: auto | none | a variant name | an image reference.
	Choice string `json:"choice"`
	// NodeName makes this override one node's.
	NodeName string `json:"nodeName,omitempty"`
	// NodeSelector makes it the override of the nodes whose labels match.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// GPUPinNode is one node's gpupin status, named after the node and
// written only by that node's agent. Cluster-scoped.
type GPUPinNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            NodeStatus `json:"status,omitempty"`
}

// NodeStatus is what a node's agent reports.
type NodeStatus struct {
	// Driver, CUDA and GPUs are the node's facts as the agent read them.
	Driver string `json:"driver,omitempty"`
	CUDA   string `json:"cuda,omitempty"`
	// GPUs are the models, one entry per device.
	GPUs []string `json:"gpus,omitempty"`
	// Simulated: the facts came from a file, not NVML; nothing is proved
	// on a GPU.
	Simulated bool `json:"simulated,omitempty"`
	// Unsupported says why the node cannot run GPU engines, if it cannot.
	Unsupported string `json:"unsupported,omitempty"`
	// Ready is "READY/WANTED" engines, for kubectl's column.
	Ready string `json:"ready,omitempty"`
	// Summary is one word per engine: KEY=STATE[/VARIANT].
	Summary string `json:"summary,omitempty"`
	// Engines are the wanted engines' statuses, by key.
	Engines []EngineStatus `json:"engines,omitempty"`
	// OverrideRejections are the EngineOverrides the node refused, with
	// why; the last good choice holds meanwhile.
	OverrideRejections []OverrideRejection `json:"overrideRejections,omitempty"`
	// UpdatedAt is the agent's latest write.
	UpdatedAt metav1.Time `json:"updatedAt,omitempty"`
	// Conditions are Ready and Degraded (ConditionReady,
	// ConditionDegraded), as Kubernetes' API conventions have them: what
	// `kubectl wait --for=condition=Ready` and controllers read.
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// EngineStatus is one engine's state on the node.
type EngineStatus struct {
	Key     string `json:"key"`
	Engine  string `json:"engine,omitempty"`
	Version string `json:"version,omitempty"`
	State   string `json:"state"`
	// Override is the effective choice and OverrideSource where it came
	// from ("EngineOverride a10-fallback (group)", "the node's file").
	Override       string `json:"override,omitempty"`
	OverrideSource string `json:"overrideSource,omitempty"`
	// Attempted is the variant last pulled or probed; Variant and Pinned
	// (repo@sha256:…) what replicas run.
	Attempted string       `json:"attempted,omitempty"`
	Variant   string       `json:"variant,omitempty"`
	Pinned    string       `json:"pinned,omitempty"`
	ProvedAt  *metav1.Time `json:"provedAt,omitempty"`
	// SignedBy is the key or keyless identity the trust policy verified
	// on the pinned image before its pull; empty when none was required.
	SignedBy  string `json:"signedBy,omitempty"`
	Simulated bool   `json:"simulated,omitempty"`
	Detail    string `json:"detail,omitempty"`
	// LastFailure is the latest failure, kept while the engine is ready
	// again until a newer one replaces it.
	LastFailure *Failure    `json:"lastFailure,omitempty"`
	Rejections  []Rejection `json:"rejections,omitempty"`
	// ProbeFailed are the variants whose probe failed in the last
	// provision, with why: what a GPU class's canary hands on.
	ProbeFailed []Rejection `json:"probeFailed,omitempty"`
	// Canary is the node of this one's GPU class whose verdict the
	// provision waits on (state resolving) or followed.
	Canary string      `json:"canary,omitempty"`
	At     metav1.Time `json:"at"`
}

// Failure is a failed provision: Reason a short CamelCase class, Message
// the detail.
type Failure struct {
	Reason    string      `json:"reason"`
	Message   string      `json:"message"`
	Variant   string      `json:"variant,omitempty"`
	At        metav1.Time `json:"at"`
	Simulated bool        `json:"simulated,omitempty"`
}

// Rejection is a variant the choice left out, and why.
type Rejection struct {
	Variant string `json:"variant"`
	Reason  string `json:"reason"`
}

// OverrideRejection is an EngineOverride the node could not apply.
type OverrideRejection struct {
	Engine string `json:"engine"`
	Source string `json:"source"`
	Choice string `json:"choice"`
	Reason string `json:"reason"`
}

// fromUnstructured converts an object the dynamic client returned.
func fromUnstructured(u *unstructured.Unstructured, into any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// toUnstructured converts an object for the dynamic client.
func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}
