package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// StatusWriter keeps the node's GPUPinNode status: on every Kick (a
// state change, new choices) and every Every it writes what Build makes,
// coalescing bursts; a failed write is retried with backoff, so the
// status catches up once the API answers again.
type StatusWriter struct {
	Dyn      dynamic.Interface
	NodeName string
	Build    func(ctx context.Context) NodeStatus
	// NodeUID is the node's Node's UID, for the owner reference that
	// lets the garbage collector remove the GPUPinNode with its Node; nil
	// or "": written without one.
	NodeUID func() types.UID
	// Every rewrites the status even without a change (facts a driver
	// upgrade changed); default a minute.
	Every  time.Duration
	Logger *slog.Logger

	kick     chan struct{}
	once     sync.Once
	writes   int
	ownerErr string // the last owner reference error logged
	mu       sync.Mutex
}

func (s *StatusWriter) init() {
	s.once.Do(func() { s.kick = make(chan struct{}, 1) })
}

// Kick asks for a write soon.
func (s *StatusWriter) Kick() {
	s.init()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Writes counts the successful writes.
func (s *StatusWriter) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// Run writes until ctx ends.
func (s *StatusWriter) Run(ctx context.Context) {
	s.init()
	if s.Every == 0 {
		s.Every = time.Minute
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	tick := time.NewTicker(s.Every)
	defer tick.Stop()
	backoff := time.Duration(0)
	noCRD := false // the last write found no GPUPinNode CRD
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
			// A burst of changes (pulling, probing, ready) is one write.
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return
			}
		case <-tick.C:
		case <-retry:
		}
		retry = nil
		if err := s.write(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 500*time.Millisecond), 30*time.Second)
			if IsCRDMissing(err) {
				// Said once, at Error: retrying does not fix it, an
				// operator does; the writes resume once the CRD is there.
				if !noCRD {
					s.Logger.Error("GPUPinNode status cannot be written until its CRD is installed; retrying", "node", s.NodeName, "err", err)
				}
				noCRD = true
			} else {
				s.Logger.Warn("GPUPinNode status not written; retrying", "node", s.NodeName, "in", backoff.String(), "err", err)
			}
			retry = time.After(backoff)
			continue
		}
		if noCRD {
			s.Logger.Info("GPUPinNode CRD installed: status written", "node", s.NodeName)
		}
		backoff, noCRD = 0, false
	}
}

func (s *StatusWriter) write(ctx context.Context) error {
	st := s.Build(ctx)
	r := s.Dyn.Resource(GPUPinNodes)
	owner := s.owner()
	cur, err := r.Get(ctx, s.NodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = s.create(ctx, owner)
	case err == nil && owner != nil && !hasOwner(cur, *owner):
		// An object an older agent made, or one whose Node was made
		// again (a new UID): the reference is added before the status
		// write, and a refusal leaves the status to be written anyway.
		if adopted, aerr := s.adopt(ctx, cur, *owner); aerr != nil {
			s.ownerNotSet(aerr)
		} else {
			cur = adopted
			s.ownerNotSet(nil)
		}
	}
	if err != nil {
		return fmt.Errorf("GPUPinNode %s: %w", s.NodeName, err)
	}
	st.Conditions = s.conditions(cur, st)
	m, err := toUnstructured(&GPUPinNode{Status: st})
	if err != nil {
		return err
	}
	cur.Object["status"] = m.Object["status"]
	if _, err := r.UpdateStatus(ctx, cur, metav1.UpdateOptions{FieldManager: "gpupin-agent"}); err != nil {
		if apierrors.IsConflict(err) {
			return errors.New("conflict; writing again")
		}
		return fmt.Errorf("GPUPinNode %s status: %w", s.NodeName, err)
	}
	s.mu.Lock()
	s.writes++
	s.mu.Unlock()
	return nil
}

// conditions merges st's conditions (computed here when Build made none)
// into those cur carries, so a lastTransitionTime moves only on a real
// change, each stamped with cur's metadata.generation.
func (s *StatusWriter) conditions(cur *unstructured.Unstructured, st NodeStatus) []metav1.Condition {
	want := st.Conditions
	if len(want) == 0 {
		want = Conditions(st, nil)
	}
	var have GPUPinNode
	if err := fromUnstructured(cur, &have); err != nil {
		// A status this agent cannot read is replaced: its conditions
		// start over rather than block every later write.
		s.Logger.Warn("GPUPinNode status unreadable; its conditions start over", "node", s.NodeName, "err", err)
		have = GPUPinNode{}
	}
	return mergeConditions(have.Status.Conditions, want, cur.GetGeneration())
}

// owner is the owner reference to the node's Node, nil while its UID is
// unknown (not listed yet, no such Node, the API down): the status is
// written without it then, and the reference added on a later write.
//
// No blockOwnerDeletion: it would only hold a foreground deletion of the
// Node for this object, and under the OwnerReferencesPermissionEnforcement
// admission plugin setting it needs update on nodes/finalizers, which an
// agent must not have. Not a controller reference either: the Node does
// not manage it.
func (s *StatusWriter) owner() *metav1.OwnerReference {
	if s.NodeUID == nil {
		return nil
	}
	uid := s.NodeUID()
	if uid == "" {
		return nil
	}
	return &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: s.NodeName, UID: uid}
}

// create makes the node's GPUPinNode, owned by its Node when owner is
// known. A create with the reference refused (under
// OwnerReferencesPermissionEnforcement, setting one needs delete on the
// object, which the agent lacks) is made again without it: the status
// matters more than its garbage collection.
func (s *StatusWriter) create(ctx context.Context, owner *metav1.OwnerReference) (*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(Group + "/" + Version)
	obj.SetKind("GPUPinNode")
	obj.SetName(s.NodeName)
	r := s.Dyn.Resource(GPUPinNodes)
	if owner != nil {
		obj.SetOwnerReferences([]metav1.OwnerReference{*owner})
		cur, err := r.Create(ctx, obj, metav1.CreateOptions{FieldManager: "gpupin-agent"})
		if err == nil || apierrors.IsAlreadyExists(err) || ctx.Err() != nil {
			return cur, err
		}
		if apierrors.IsNotFound(err) {
			return nil, notServed(GPUPinNodes, err)
		}
		s.ownerNotSet(err)
		obj.SetOwnerReferences(nil)
	}
	cur, err := r.Create(ctx, obj, metav1.CreateOptions{FieldManager: "gpupin-agent"})
	return cur, notServed(GPUPinNodes, err)
}

// adopt adds owner to cur's owner references with a merge patch that
// names cur's resourceVersion (a conflict rather than a lost reference
// another writer added meanwhile). Another Node reference (the Node made
// again under the same name) is replaced; references to anything else
// are kept.
func (s *StatusWriter) adopt(ctx context.Context, cur *unstructured.Unstructured, owner metav1.OwnerReference) (*unstructured.Unstructured, error) {
	refs := []metav1.OwnerReference{owner}
	for _, r := range cur.GetOwnerReferences() {
		if !isNodeRef(r) {
			refs = append(refs, r)
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": cur.GetResourceVersion(), "ownerReferences": refs}})
	if err != nil {
		return nil, err
	}
	out, err := s.Dyn.Resource(GPUPinNodes).Patch(ctx, s.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "gpupin-agent"})
	if err != nil {
		return nil, fmt.Errorf("owner reference to Node %s: %w", s.NodeName, err)
	}
	return out, nil
}

// ownerNotSet logs a refused owner reference once per distinct error
// (the status is rewritten every minute), and its recovery; nil: set.
func (s *StatusWriter) ownerNotSet(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil && s.ownerErr != "":
		s.Logger.Info("GPUPinNode owner reference to its Node set", "node", s.NodeName)
		s.ownerErr = ""
	case err != nil && err.Error() != s.ownerErr:
		s.Logger.Warn("GPUPinNode written without an owner reference to its Node: deleting the Node will not remove it",
			"node", s.NodeName, "err", err)
		s.ownerErr = err.Error()
	}
}

func isNodeRef(r metav1.OwnerReference) bool { return r.APIVersion == "v1" && r.Kind == "Node" }

// hasOwner says whether cur already names owner (by UID, as the garbage
// collector matches owners).
func hasOwner(cur *unstructured.Unstructured, owner metav1.OwnerReference) bool {
	for _, r := range cur.GetOwnerReferences() {
		if isNodeRef(r) && r.UID == owner.UID {
			return true
		}
	}
	return false
}

// BuildStatus makes a node's status from the agent's engine statuses,
// the node's facts (nil when unread), the cluster's choices and the
// overrides of the node's own files; lastFailure carries each key's last
// failure over a later success.
func BuildStatus(sts []provision.Status, facts *node.Facts, ch Choices, fileOv map[string]string, lastFailure map[string]*Failure) NodeStatus {
	ns := NodeStatus{UpdatedAt: metav1.Now()}
	if facts != nil {
		ns.Driver, ns.CUDA, ns.Simulated, ns.Unsupported = facts.Driver, facts.CUDA, facts.Simulated, facts.Unsupported
		for _, g := range facts.GPUs {
			ns.GPUs = append(ns.GPUs, g.Name)
		}
	}
	sort.Slice(sts, func(i, j int) bool { return sts[i].Key < sts[j].Key })
	ready := 0
	var sum []string
	for _, st := range sts {
		es := EngineStatus{Key: st.Key, Engine: st.Engine, Version: st.Version, State: string(st.State), Override: st.Override,
			Attempted: st.Attempted, Variant: st.Variant, Pinned: st.Pinned, Simulated: st.Simulated, Detail: clip(st.Detail, 1024),
			At: metav1.NewTime(st.At)}
		switch {
		case ch.Sources[st.Engine] != "":
			es.OverrideSource = ch.Sources[st.Engine]
		case fileOv[st.Engine] != "":
			es.OverrideSource = "the node's overrides file"
		default:
			es.OverrideSource = "default"
		}
		if st.Pin != nil && !st.Pin.ProbedAt.IsZero() {
			t := metav1.NewTime(st.Pin.ProbedAt)
			es.ProvedAt = &t
		}
		if st.Pin != nil && st.Pin.Signed != nil {
			es.SignedBy = clip(st.Pin.Signed.By, 512)
		}
		for _, r := range st.Rejected {
			es.Rejections = append(es.Rejections, Rejection{Variant: r.Variant, Reason: r.Reason})
		}
		for _, a := range st.Attempts {
			if a.Stage == "probe" {
				es.ProbeFailed = append(es.ProbeFailed, Rejection{Variant: a.Variant, Reason: clip(a.Reason, 512)})
			}
		}
		es.Canary = st.Canary
		if st.State == provision.Failed {
			lastFailure[st.Key] = &Failure{Reason: FailureReason(st), Message: clip(st.Detail, 1024), Variant: st.Attempted,
				At: metav1.NewTime(st.At), Simulated: st.Simulated}
		}
		es.LastFailure = lastFailure[st.Key]
		if st.State == provision.Ready {
			ready++
		}
		w := st.Key + "=" + string(st.State)
		if st.Variant != "" {
			w += "/" + st.Variant
		}
		sum = append(sum, w)
		ns.Engines = append(ns.Engines, es)
	}
	ns.Ready = fmt.Sprintf("%d/%d", ready, len(sts))
	ns.Summary = strings.Join(sum, " ")
	ns.OverrideRejections = ch.Rejections
	return ns
}

// FailureReason classes a failed status in a word, for the fleet matrix
// and Events: what failed (the stage of the last attempt) or why nothing
// was tried.
func FailureReason(st provision.Status) string {
	switch {
	case errors.Is(st.Err, provision.ErrNoCandidate):
		return "NoCandidate"
	case errors.Is(st.Err, provision.ErrConflict):
		return "Conflict"
	case errors.Is(st.Err, provision.ErrInvalidWant):
		return "InvalidWant"
	}
	if n := len(st.Attempts); n > 0 {
		switch st.Attempts[n-1].Stage {
		case "pull":
			return "PullFailed"
		case "probe":
			return "ProbeFailed"
		case "pin":
			return "PinFailed"
		}
	}
	if len(st.Attempts) == 0 && len(st.Rejected) > 0 {
		return "NoCandidate"
	}
	return "Failed"
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// NodeRef is the reference Events about a Node carry. kubelet names a
// Node's UID by its name in its Events, and `kubectl describe node` looks
// for exactly that.
func NodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

// stateEvent is the Event for an engine's new state; ok false for the
// states on the way (pending, resolving, pulling, probing).
func stateEvent(st provision.Status, source string) (eventType, reason, msg string, ok bool) {
	sim := ""
	if st.Simulated {
		sim = " (SIMULATED)"
	}
	from := ""
	if st.Override != "" && st.Override != "auto" {
		from = fmt.Sprintf("; override %s from %s", st.Override, source)
	}
	switch st.State {
	case provision.Ready:
		return corev1.EventTypeNormal, "EngineReady", fmt.Sprintf("%s: %s proved and pinned as %s%s%s", st.Key, st.Variant, st.Pinned, sim, from), true
	case provision.Failed:
		return corev1.EventTypeWarning, "Engine" + FailureReason(st), fmt.Sprintf("%s: %s%s%s", st.Key, clip(st.Detail, 512), sim, from), true
	case provision.Disabled:
		return corev1.EventTypeNormal, "EngineDisabled", fmt.Sprintf("%s: none on this node%s", st.Key, from), true
	case provision.Unsupported:
		return corev1.EventTypeWarning, "EngineUnsupported", fmt.Sprintf("%s: %s", st.Key, clip(st.Detail, 512)), true
	}
	return "", "", "", false
}

// recordState records st's Event on the Node when its state or variant
// changed since the last one recorded for its key.
func recordState(rec record.EventRecorder, nodeName string, last map[string]string, st provision.Status, source string) {
	typ, reason, msg, ok := stateEvent(st, source)
	if !ok {
		return
	}
	sig := reason + "/" + st.Variant + "/" + st.Attempted
	if last[st.Key] == sig {
		return
	}
	last[st.Key] = sig
	rec.Event(NodeRef(nodeName), typ, reason, msg)
}
