package fleet

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The GPUPinNode's condition types (status.conditions, metav1.Condition),
// so `kubectl wait --for=condition=Ready gpupinnode/NODE` works.
const (
	// ConditionReady is True when every wanted engine is settled in a
	// state replicas can use: ready (proved and pinned), disabled by a
	// `none` choice, or failed while an earlier pin proved on this node
	// stays in place. False while work is under way, or when an engine has
	// failed with nothing to fall back on or cannot run on the node.
	ConditionReady = "Ready"
	// ConditionDegraded is True while an engine's latest provision failed
	// (kept pin or not), an engine is unsupported on the node, or an
	// EngineOverride could not be applied; the message says which and why.
	ConditionDegraded = "Degraded"
)

// The conditions' reasons. Degraded's reason for a failed engine is that
// failure's own (FailureReason: ProbeFailed, PullFailed, NoCandidate, …).
const (
	ReasonEnginesReady     = "EnginesReady"     // Ready True
	ReasonNoEngines        = "NoEngines"        // Ready True: nothing wanted on the node
	ReasonProvisioning     = "Provisioning"     // Ready False: resolving, pulling, probing, pending
	ReasonEngineFailed     = "EngineFailed"     // Ready False: failed, and no earlier pin to run
	ReasonUnsupported      = "Unsupported"      // Ready False, Degraded True: the node cannot run it
	ReasonOverrideRejected = "OverrideRejected" // Degraded True
	ReasonNoFailures       = "NoFailures"       // Degraded False
)

// maxConditionMessage keeps a message readable in `kubectl describe`
// (the API allows 32768).
const maxConditionMessage = 4096

// Conditions computes the node's Ready and Degraded conditions from its
// status, without observedGeneration and lastTransitionTime: the writer
// sets those when it merges them into the object's (mergeConditions).
//
// settled is each key's last settled engine status (rememberSettled), so
// that the loop's quiet retry of a failed engine is judged as that
// failure, not as new work: without it Ready and Degraded would flip at
// every retry. nil: none known.
func Conditions(st NodeStatus, settled map[string]EngineStatus) []metav1.Condition {
	var (
		ready, disabled, kept []string // "KEY VARIANT" / "KEY"
		notReady              []string // why Ready is False, per engine
		problems              []string // Degraded's message, per engine
		failReason            string   // the first failed engine's reason
		anyFailed, anyUnsup   bool
		anyWorking            bool
	)
	for _, e := range st.Engines {
		j, retry := e, false
		if underWayState(e.State) {
			if s, ok := settled[e.Key]; ok && s.State == "failed" && s.Override == e.Override {
				j, retry = s, true
			}
		}
		switch j.State {
		case "ready":
			ready = append(ready, withVariant(e.Key, j.Variant))
		case "disabled":
			disabled = append(disabled, e.Key)
		case "failed":
			reason, line := failureLine(j, retry)
			if failReason == "" {
				failReason = reason
			}
			problems = append(problems, line)
			if j.Pinned != "" {
				kept = append(kept, withVariant(e.Key, j.Variant))
			} else {
				anyFailed = true
				notReady = append(notReady, fmt.Sprintf("%s failed (%s), no earlier pin to run", e.Key, reason))
			}
		case "unsupported":
			anyUnsup = true
			line := e.Key + ": unsupported on this node"
			if j.Detail != "" {
				line += ": " + clip(j.Detail, 512)
			}
			problems = append(problems, line)
			notReady = append(notReady, e.Key+" unsupported")
		default: // pending, resolving, pulling, probing
			anyWorking = true
			what := e.Key + " " + e.State
			if e.Attempted != "" && (e.State == "pulling" || e.State == "probing") {
				what += " " + e.Attempted
			}
			if e.Detail != "" {
				what += ": " + clip(e.Detail, 256)
			}
			notReady = append(notReady, what)
		}
	}
	for _, r := range st.OverrideRejections {
		problems = append(problems, fmt.Sprintf("%s: %s for %s not applied, the last good choice holds: %s",
			r.Source, r.Choice, r.Engine, clip(r.Reason, 512)))
	}

	sim := ""
	if st.Simulated {
		sim = " (SIMULATED facts: nothing was proved on a GPU)"
	}
	rc := metav1.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonEnginesReady}
	var msg []string
	switch {
	case len(st.Engines) == 0:
		rc.Reason = ReasonNoEngines
		msg = append(msg, "no engines wanted on this node")
	case anyFailed:
		rc.Status, rc.Reason = metav1.ConditionFalse, ReasonEngineFailed
	case anyUnsup:
		rc.Status, rc.Reason = metav1.ConditionFalse, ReasonUnsupported
	case anyWorking:
		rc.Status, rc.Reason = metav1.ConditionFalse, ReasonProvisioning
	}
	if len(st.Engines) > 0 {
		msg = append(msg, fmt.Sprintf("%d/%d engines ready", len(ready), len(st.Engines)))
		if len(ready) > 0 {
			msg[len(msg)-1] += " (" + strings.Join(ready, ", ") + ")"
		}
	}
	if len(disabled) > 0 {
		msg = append(msg, "disabled by choice: "+strings.Join(disabled, ", "))
	}
	if len(kept) > 0 {
		msg = append(msg, "running an earlier pin after a failure (see Degraded): "+strings.Join(kept, ", "))
	}
	msg = append(msg, notReady...)
	if st.Unsupported != "" {
		msg = append(msg, "node unsupported: "+clip(st.Unsupported, 512))
	}
	rc.Message = clip(strings.Join(msg, "; ")+sim, maxConditionMessage)

	dc := metav1.Condition{Type: ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonNoFailures,
		Message: "no engine failed and every EngineOverride applied"}
	if len(problems) > 0 {
		dc.Status = metav1.ConditionTrue
		switch {
		case failReason != "":
			dc.Reason = failReason
		case anyUnsup:
			dc.Reason = ReasonUnsupported
		default:
			dc.Reason = ReasonOverrideRejected
		}
		dc.Message = clip(strings.Join(problems, "; ")+sim, maxConditionMessage)
	}
	return []metav1.Condition{rc, dc}
}

// failureLine is a failed engine's reason and the line that says what a
// person can act on: the key (engine:version), the variant tried, the
// error, and what replicas run meanwhile.
func failureLine(e EngineStatus, retry bool) (reason, line string) {
	reason, msg, variant, sim := "Failed", e.Detail, e.Attempted, e.Simulated
	if f := e.LastFailure; f != nil {
		reason, msg, sim = f.Reason, f.Message, f.Simulated
		if f.Variant != "" {
			variant = f.Variant
		}
	}
	if !validReason(reason) {
		reason = "Failed"
	}
	line = e.Key + ": " + reason
	if variant != "" {
		line += " on " + variant
	}
	if msg != "" {
		line += ": " + clip(msg, 512)
	}
	if e.Pinned != "" {
		line += fmt.Sprintf("; the earlier pin %s (%s) stays, replicas keep starting from it", e.Pinned, e.Variant)
	}
	if sim {
		line += " (SIMULATED)"
	}
	if retry {
		line += " (retrying)"
	}
	return reason, line
}

// validReason is metav1.Condition's reason grammar, which the API server
// enforces (a reason that broke it would fail the whole status write).
func validReason(s string) bool {
	if s == "" || len(s) > 1024 {
		return false
	}
	for i, c := range s {
		letter := c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
		switch {
		case i == 0 && !letter:
			return false
		case letter || c >= '0' && c <= '9' || c == '_':
		case (c == ',' || c == ':') && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

func withVariant(key, variant string) string {
	if variant == "" {
		return key
	}
	return key + " " + variant
}

func underWayState(s string) bool {
	switch s {
	case "pending", "resolving", "pulling", "probing":
		return true
	}
	return false
}

// rememberSettled records each engine's settled status (any but the
// states under way) and forgets the keys no longer wanted.
func rememberSettled(settled map[string]EngineStatus, engines []EngineStatus) {
	wanted := map[string]bool{}
	for _, e := range engines {
		wanted[e.Key] = true
		if !underWayState(e.State) {
			settled[e.Key] = e
		}
	}
	for k := range settled {
		if !wanted[k] {
			delete(settled, k)
		}
	}
}

// mergeConditions sets want over have with meta.SetStatusCondition, so a
// condition's lastTransitionTime moves only when its status does, and
// stamps each with gen, the object's metadata.generation. Condition types
// the agent no longer sets are dropped.
func mergeConditions(have, want []metav1.Condition, gen int64) []metav1.Condition {
	ours := map[string]bool{}
	for _, c := range want {
		ours[c.Type] = true
	}
	out := make([]metav1.Condition, 0, len(want))
	for _, c := range have {
		if ours[c.Type] {
			out = append(out, c)
		}
	}
	for _, c := range want {
		c.ObservedGeneration = gen
		meta.SetStatusCondition(&out, c)
	}
	return out
}
