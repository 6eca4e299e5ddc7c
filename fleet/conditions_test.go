package fleet

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const pinnedRef = "reg.example/vllm@sha256:aaaa"

func readyEngine(key, variant string) EngineStatus {
	return EngineStatus{Key: key, State: "ready", Variant: variant, Pinned: pinnedRef, Override: "auto"}
}

func failedEngine(key, reason, variant, msg string) EngineStatus {
	return EngineStatus{Key: key, State: "failed", Attempted: variant, Override: "auto", Detail: msg,
		LastFailure: &Failure{Reason: reason, Message: msg, Variant: variant}}
}

// The conditions' statuses, reasons and messages for each shape of a
// node's engines, without an API server.
func TestConditionsFromEngineStates(t *testing.T) {
	probeFail := failedEngine("vllm:0.11.0", "ProbeFailed", "cu13", "probe failed: no GPUPIN-PROBE line")
	kept := probeFail
	kept.Variant, kept.Pinned = "cu129", pinnedRef
	recovered := readyEngine("vllm:0.11.0", "cu13")
	recovered.LastFailure = probeFail.LastFailure // kept over the later success
	cases := []struct {
		name              string
		st                NodeStatus
		settled           map[string]EngineStatus
		ready, degraded   metav1.ConditionStatus
		readyR, degradedR string
		readyMsg, degrMsg []string // substrings each message must hold
	}{
		{name: "nothing wanted", st: NodeStatus{},
			ready: "True", readyR: ReasonNoEngines, degraded: "False", degradedR: ReasonNoFailures,
			readyMsg: []string{"no engines wanted"}},
		{name: "all ready", st: NodeStatus{Engines: []EngineStatus{readyEngine("sglang:0.5.0", "cu129"), readyEngine("vllm:0.11.0", "cu13")}},
			ready: "True", readyR: ReasonEnginesReady, degraded: "False", degradedR: ReasonNoFailures,
			readyMsg: []string{"2/2 engines ready (sglang:0.5.0 cu129, vllm:0.11.0 cu13)"}},
		{name: "ready and disabled by choice", st: NodeStatus{Engines: []EngineStatus{
			{Key: "sglang:0.5.0", State: "disabled", Override: "none"}, readyEngine("vllm:0.11.0", "cu13")}},
			ready: "True", readyR: ReasonEnginesReady, degraded: "False", degradedR: ReasonNoFailures,
			readyMsg: []string{"1/2 engines ready", "disabled by choice: sglang:0.5.0"}},
		{name: "an old failure kept over a success", st: NodeStatus{Engines: []EngineStatus{recovered}},
			ready: "True", readyR: ReasonEnginesReady, degraded: "False", degradedR: ReasonNoFailures},
		{name: "in flight", st: NodeStatus{Engines: []EngineStatus{readyEngine("sglang:0.5.0", "cu129"),
			{Key: "vllm:0.11.0", State: "probing", Attempted: "cu13", Detail: "probing reg.example/vllm:0.11.0-cu13"}}},
			ready: "False", readyR: ReasonProvisioning, degraded: "False", degradedR: ReasonNoFailures,
			readyMsg: []string{"1/2 engines ready", "vllm:0.11.0 probing cu13: probing reg.example/vllm:0.11.0-cu13"}},
		{name: "pending", st: NodeStatus{Engines: []EngineStatus{{Key: "vllm:0.11.0", State: "pending", Detail: "waiting for its first pass"}}},
			ready: "False", readyR: ReasonProvisioning, degraded: "False", degradedR: ReasonNoFailures},
		{name: "probe failed, nothing pinned", st: NodeStatus{Engines: []EngineStatus{probeFail}},
			ready: "False", readyR: ReasonEngineFailed, degraded: "True", degradedR: "ProbeFailed",
			readyMsg: []string{"vllm:0.11.0 failed (ProbeFailed), no earlier pin"},
			degrMsg:  []string{"vllm:0.11.0: ProbeFailed on cu13: probe failed: no GPUPIN-PROBE line"}},
		{name: "probe failed, earlier pin kept", st: NodeStatus{Engines: []EngineStatus{kept}},
			ready: "True", readyR: ReasonEnginesReady, degraded: "True", degradedR: "ProbeFailed",
			readyMsg: []string{"0/1 engines ready", "running an earlier pin after a failure (see Degraded): vllm:0.11.0 cu129"},
			degrMsg:  []string{"ProbeFailed on cu13", "the earlier pin " + pinnedRef + " (cu129) stays"}},
		{name: "a failure beats work under way", st: NodeStatus{Engines: []EngineStatus{
			failedEngine("sglang:0.5.0", "PullFailed", "cu129", "pull: 503 Service Unavailable"),
			{Key: "vllm:0.11.0", State: "pulling", Attempted: "cu13"}}},
			ready: "False", readyR: ReasonEngineFailed, degraded: "True", degradedR: "PullFailed",
			readyMsg: []string{"sglang:0.5.0 failed (PullFailed)", "vllm:0.11.0 pulling cu13"},
			degrMsg:  []string{"sglang:0.5.0: PullFailed on cu129: pull: 503 Service Unavailable"}},
		{name: "retry after a failure stays failed", st: NodeStatus{Engines: []EngineStatus{
			{Key: "vllm:0.11.0", State: "pulling", Attempted: "cu13", Override: "auto", LastFailure: probeFail.LastFailure}}},
			settled: map[string]EngineStatus{"vllm:0.11.0": probeFail},
			ready:   "False", readyR: ReasonEngineFailed, degraded: "True", degradedR: "ProbeFailed",
			degrMsg: []string{"vllm:0.11.0: ProbeFailed on cu13", "(retrying)"}},
		{name: "retry with an earlier pin stays ready", st: NodeStatus{Engines: []EngineStatus{
			{Key: "vllm:0.11.0", State: "probing", Attempted: "cu13", Override: "auto"}}},
			settled: map[string]EngineStatus{"vllm:0.11.0": kept},
			ready:   "True", readyR: ReasonEnginesReady, degraded: "True", degradedR: "ProbeFailed"},
		{name: "a new choice after a failure is new work", st: NodeStatus{Engines: []EngineStatus{
			{Key: "vllm:0.11.0", State: "pulling", Attempted: "cu129", Override: "cu129"}}},
			settled: map[string]EngineStatus{"vllm:0.11.0": probeFail},
			ready:   "False", readyR: ReasonProvisioning, degraded: "False", degradedR: ReasonNoFailures},
		{name: "no candidate", st: NodeStatus{Engines: []EngineStatus{failedEngine("vllm:0.11.0", "NoCandidate", "",
			"no variant fits: driver 535.104 supports CUDA 12.2; cu129 needs 12.9")}}, ready: "False", readyR: ReasonEngineFailed,
			degraded: "True", degradedR: "NoCandidate", degrMsg: []string{"vllm:0.11.0: NoCandidate: no variant fits: driver 535.104"}},
		{name: "unsupported node", st: NodeStatus{Unsupported: "no NVIDIA driver", Engines: []EngineStatus{
			{Key: "vllm:0.11.0", State: "unsupported", Detail: "no NVIDIA driver: libnvidia-ml.so.1 not found"}}},
			ready: "False", readyR: ReasonUnsupported, degraded: "True", degradedR: ReasonUnsupported,
			readyMsg: []string{"vllm:0.11.0 unsupported", "node unsupported: no NVIDIA driver"},
			degrMsg:  []string{"vllm:0.11.0: unsupported on this node: no NVIDIA driver: libnvidia-ml.so.1 not found"}},
		{name: "override rejected", st: NodeStatus{Engines: []EngineStatus{readyEngine("vllm:0.11.0", "cu129")},
			OverrideRejections: []OverrideRejection{{Engine: "vllm", Source: "EngineOverride bad (node)", Choice: "cu13@@bad", Reason: "not a variant or reference"}}},
			ready: "True", readyR: ReasonEnginesReady, degraded: "True", degradedR: ReasonOverrideRejected,
			degrMsg: []string{"EngineOverride bad (node): cu13@@bad for vllm not applied, the last good choice holds: not a variant or reference"}},
		{name: "a reason outside the grammar", st: NodeStatus{Engines: []EngineStatus{failedEngine("vllm:0.11.0", "probe failed!", "cu13", "x")}},
			ready: "False", readyR: ReasonEngineFailed, degraded: "True", degradedR: "Failed"},
		{name: "simulated", st: NodeStatus{Simulated: true, Engines: []EngineStatus{readyEngine("vllm:0.11.0", "cu13")}},
			ready: "True", readyR: ReasonEnginesReady, degraded: "False", degradedR: ReasonNoFailures,
			readyMsg: []string{"SIMULATED"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Conditions(c.st, c.settled)
			if len(got) != 2 {
				t.Fatalf("conditions %+v, want Ready and Degraded", got)
			}
			r, d := meta.FindStatusCondition(got, ConditionReady), meta.FindStatusCondition(got, ConditionDegraded)
			if r == nil || d == nil {
				t.Fatalf("conditions %+v, want Ready and Degraded", got)
			}
			if r.Status != c.ready || r.Reason != c.readyR {
				t.Errorf("Ready %s/%s (%q), want %s/%s", r.Status, r.Reason, r.Message, c.ready, c.readyR)
			}
			if d.Status != c.degraded || d.Reason != c.degradedR {
				t.Errorf("Degraded %s/%s (%q), want %s/%s", d.Status, d.Reason, d.Message, c.degraded, c.degradedR)
			}
			for _, w := range c.readyMsg {
				if !strings.Contains(r.Message, w) {
					t.Errorf("Ready's message %q lacks %q", r.Message, w)
				}
			}
			for _, w := range c.degrMsg {
				if !strings.Contains(d.Message, w) {
					t.Errorf("Degraded's message %q lacks %q", d.Message, w)
				}
			}
			for _, cond := range got {
				if !validReason(cond.Reason) || cond.Message == "" || len(cond.Message) > maxConditionMessage+len("…") {
					t.Errorf("%s: reason %q, message of %d bytes", cond.Type, cond.Reason, len(cond.Message))
				}
			}
		})
	}
}

// A long failure is clipped to a message kubectl describe can show.
func TestConditionMessageClipped(t *testing.T) {
	var st NodeStatus
	for i := 0; i < 50; i++ {
		st.Engines = append(st.Engines, failedEngine("e"+strings.Repeat("x", i)+":1", "ProbeFailed", "cu13", strings.Repeat("y", 2000)))
	}
	for _, c := range Conditions(st, nil) {
		if len(c.Message) > maxConditionMessage+len("…") {
			t.Errorf("%s message %d bytes", c.Type, len(c.Message))
		}
	}
}

// Merging keeps lastTransitionTime while a condition's status stays, and
// moves it when the status changes; every condition carries the object's
// generation; types the agent does not set are dropped.
func TestMergeConditions(t *testing.T) {
	old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	have := []metav1.Condition{
		{Type: ConditionReady, Status: "True", Reason: ReasonEnginesReady, Message: "old", LastTransitionTime: old, ObservedGeneration: 1},
		{Type: ConditionDegraded, Status: "False", Reason: ReasonNoFailures, Message: "m", LastTransitionTime: old, ObservedGeneration: 1},
		{Type: "Stale", Status: "True", Reason: "Gone", Message: "m", LastTransitionTime: old},
	}
	want := Conditions(NodeStatus{Engines: []EngineStatus{readyEngine("vllm:0.11.0", "cu13"),
		failedEngine("sglang:0.5.0", "ProbeFailed", "cu129", "bad")}}, nil)
	// sglang failed with no pin: Ready goes False, Degraded True.
	got := mergeConditions(have, want, 3)
	if len(got) != 2 || meta.FindStatusCondition(got, "Stale") != nil {
		t.Fatalf("merged %+v", got)
	}
	for _, c := range got {
		if c.ObservedGeneration != 3 {
			t.Errorf("%s observedGeneration %d, want 3", c.Type, c.ObservedGeneration)
		}
		if !c.LastTransitionTime.After(old.Time) {
			t.Errorf("%s changed status, lastTransitionTime %s not moved", c.Type, c.LastTransitionTime)
		}
	}
	// The same statuses again, another message: the times stay.
	moved := got[0].LastTransitionTime
	want[0].Message = "another message"
	again := mergeConditions(got, want, 3)
	r := meta.FindStatusCondition(again, ConditionReady)
	if !r.LastTransitionTime.Equal(&moved) || r.Message != "another message" {
		t.Errorf("unchanged status: lastTransitionTime %s (was %s), message %q", r.LastTransitionTime, moved, r.Message)
	}
}

// The settled memory keeps the last state that is not under way, and
// forgets keys no longer wanted.
func TestRememberSettled(t *testing.T) {
	m := map[string]EngineStatus{"gone:1": readyEngine("gone:1", "cu13")}
	f := failedEngine("vllm:0.11.0", "ProbeFailed", "cu13", "x")
	rememberSettled(m, []EngineStatus{f})
	rememberSettled(m, []EngineStatus{{Key: "vllm:0.11.0", State: "pulling"}})
	if len(m) != 1 || m["vllm:0.11.0"].State != "failed" {
		t.Fatalf("settled %+v", m)
	}
}
