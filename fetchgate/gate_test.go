package fetchgate

import (
	"context"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// nowhere is a lease client for an API server that is not there: the
// tests that use it must finish without asking it anything.
func nowhere(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestOptionsRefuseUnboundedValues(t *testing.T) {
	cs := nowhere(t)
	for name, o := range map[string]Option{
		"concurrency 0":  WithConcurrency(0),
		"max wait 0":     WithMaxWait(0),
		"lease 0":        WithLeaseDuration(0),
		"outage 0":       WithOutageBound(0),
		"min progress 0": WithMinProgress(0),
	} {
		if _, err := New(cs.CoordinationV1(), "ns", "n1", o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(cs.CoordinationV1(), "", "n1"); err == nil {
		t.Error("no namespace: accepted")
	}
}

func TestNamesAndDigests(t *testing.T) {
	if got := LeaseName(testDigest, 0); got != "gpupin-fetch-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef-0" || len(got) > 253 {
		t.Errorf("lease name %q", got)
	}
	if l := digestLabel(testDigest); len(l) != 63 {
		t.Errorf("label value %q: %d characters", l, len(l))
	}
	for ref, ok := range map[string]bool{
		"reg/org/vllm@" + testDigest:        true,
		"reg/org/vllm:0.11.0":               false,
		"reg/org/vllm@sha256:abc":           false,
		"reg:5000/org/vllm:1@" + testDigest: true,
	} {
		if _, got := digestOf(ref); got != ok {
			t.Errorf("digestOf(%q) = %v", ref, got)
		}
	}
}

func lease(name, holder, state string, renew time.Time, secs int32) *coordv1.Lease {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotState: state}}}
	if holder != "" {
		l.Spec.HolderIdentity = &holder
	}
	rt := metav1.NewMicroTime(renew)
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &rt, &secs
	return l
}

// TestJudgeCountsOurClock: a lease runs out once this node has seen it
// unrenewed for its duration, whatever the holder's clock wrote (within
// maxSkew); fetched wins; released, unserved and our own old lease are
// free.
func TestJudgeCountsOurClock(t *testing.T) {
	g, err := New(nowhere(t).CoordinationV1(), "ns", "me", WithConcurrency(2))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	seen := map[string]observed{}
	n0, n1 := LeaseName(testDigest, 0), LeaseName(testDigest, 1)
	// The holder's clock runs 40 s behind: still held when first seen.
	slots := []*coordv1.Lease{lease(n0, "other", StateFetching, now.Add(-40*time.Second), 30), nil}
	v := g.judge(slots, seen, now)
	if len(v.free) != 1 || v.free[0] != 1 || len(v.holders) != 1 || !v.recheck.Equal(now.Add(30*time.Second)) {
		t.Fatalf("first sight: %+v", v)
	}
	// Unrenewed for 29 s of our clock: held; at 30 s: free.
	if v := g.judge(slots, seen, now.Add(29*time.Second)); len(v.holders) != 1 {
		t.Errorf("at 29s: %+v", v)
	}
	if v := g.judge(slots, seen, now.Add(30*time.Second)); len(v.free) != 2 {
		t.Errorf("at 30s: %+v", v)
	}
	// A renewal seen resets our count.
	slots[0] = lease(n0, "other", StateFetching, now.Add(-10*time.Second), 30)
	if v := g.judge(slots, seen, now.Add(31*time.Second)); len(v.holders) != 1 {
		t.Errorf("renewed: %+v", v)
	}
	// Older than its duration plus maxSkew by any clock: free at once.
	if v := g.judge([]*coordv1.Lease{lease("x", "other", StateFetching, now.Add(-2*time.Hour), 30), nil}, map[string]observed{}, now); len(v.free) != 2 {
		t.Errorf("an old lease: %+v", v)
	}
	for _, c := range []struct {
		holder, state string
	}{{"", StateFetching}, {"other", StateReleased}, {"other", StateUnserved}, {"me", StateFetching}} {
		v := g.judge([]*coordv1.Lease{lease(n0, c.holder, c.state, now, 30), lease(n1, "busy", StateFetching, now, 30)}, map[string]observed{}, now)
		if len(v.free) != 1 || v.free[0] != 0 {
			t.Errorf("%+v: %+v", c, v)
		}
	}
	v = g.judge([]*coordv1.Lease{lease(n0, "busy", StateFetching, now, 30), lease(n1, "done", StateFetched, now, 30)}, map[string]observed{}, now)
	if v.fetchedBy != "done" {
		t.Errorf("fetched: %+v", v)
	}
}

// TestNoMirrorNoWait: with no mirror named, or none answering, the pull
// starts at once (the API, which is not there, is never asked).
func TestNoMirrorNoWait(t *testing.T) {
	for name, hosts := range map[string][]string{
		"no mirror":       nil,
		"mirror silent":   {"http://127.0.0.1:1"},
		"mirror unrouted": {"http://192.0.2.1:5000"}, // TEST-NET-1: times out
	} {
		t.Run(name, func(t *testing.T) {
			g, err := New(nowhere(t).CoordinationV1(), "ns", "n1", WithOutageBound(time.Hour),
				WithMirrors(func(context.Context, string) ([]string, error) { return hosts, nil }))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var notes []string
			pulled := false
			err = g.Fetch(context.Background(), "reg/org/vllm@"+testDigest, func(s string) { notes = append(notes, s) },
				func(context.Context, func(int64, int64), Await) error { pulled = true; return nil })
			if err != nil || !pulled {
				t.Fatalf("err %v, pulled %v", err, pulled)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("took %s", d)
			}
			if len(notes) != 1 || !strings.Contains(notes[0], "fetching from upstream: no mirror") {
				t.Errorf("notes %q", notes)
			}
		})
	}
}

// TestLocalOrUndigestedNoWait: an image on the node, or a reference
// without a digest, is pulled at once.
func TestLocalOrUndigestedNoWait(t *testing.T) {
	g, err := New(nowhere(t).CoordinationV1(), "ns", "n1", WithOutageBound(time.Hour),
		WithLocal(func(_ context.Context, ref string) bool { return strings.Contains(ref, "local") }))
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"reg/org/local@" + testDigest, "reg/org/vllm:0.11.0"} {
		pulled := false
		if err := g.Fetch(context.Background(), ref, nil, func(context.Context, func(int64, int64), Await) error { pulled = true; return nil }); err != nil || !pulled {
			t.Errorf("%s: err %v, pulled %v", ref, err, pulled)
		}
	}
}
