package pins

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd/conn"
)

// The decisions are tables over values: no daemon, no clock.

var t0 = time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)

const (
	testKey   = "eng:1"
	testOwn   = "gpupin.local/eng:1"
	testOther = "other.local/eng:1"
)

var testNaming = localNaming{own: testOwn, prefix: DefaultLocalPrefix}

// stored is the proof of img as a lease holds it.
func stored(img images.Image) storedProof {
	return storedProof{proof: proofOf(img), on: img.Target.Digest, valid: true}
}

func tampered(img images.Image) images.Image {
	img.Target.Digest = digest.FromString("else")
	return img
}

func relabelled(img images.Image, at time.Time) images.Image {
	img.Labels = map[string]string{}
	img.UpdatedAt = at
	return img
}

// localOf is a local-name record gpupin wrote for the pin cur.
func localOf(name string, cur images.Image) images.Image {
	return images.Image{Name: name, Target: cur.Target, Labels: localLabels(testKey, cur)}
}

func TestActionNames(t *testing.T) {
	want := map[action]string{actRelabelled: "relabelled", actRecreated: "recreated", actDropped: "dropped", actProof: "proof",
		actLocal: "local", actCleared: "cleared", actForeign: "foreign", 0: "action(0)", 99: "action(99)"}
	for a, name := range want {
		if a.String() != name {
			t.Errorf("action %d is %q; want %q", int(a), a.String(), name)
		}
	}
	if r := actLocal.report(testKey, testOwn, "now x"); r != (Recovered{Key: testKey, Ref: testOwn, Action: "local", Detail: "now x"}) {
		t.Errorf("report = %+v", r)
	}
	for o := localMove; o <= localUnlabel; o++ {
		if strings.HasPrefix(o.String(), "localOp(") {
			t.Errorf("local step %d has no name", int(o))
		}
	}
}

func TestBestAndNewest(t *testing.T) {
	a, b := pinRecord(testKey, "a", t0), pinRecord(testKey, "b", t0.Add(time.Second))
	tie := pinRecord(testKey, "c", t0)
	cases := []struct {
		name   string
		pins   []images.Image
		proofs []storedProof
		best   string // its name; "" none
		newest string // the Ref of the proof; "" none
	}{
		{name: "nothing"},
		{name: "one pin", pins: []images.Image{a}, best: a.Name},
		{name: "the newer of two", pins: []images.Image{a, b}, best: b.Name},
		{name: "containerd's clock ties: the name decides", pins: []images.Image{a, tie}, best: max(a.Name, tie.Name)},
		{name: "a tampered record is never the pin", pins: []images.Image{a, tampered(b)}, best: a.Name},
		{name: "only tampered records", pins: []images.Image{tampered(a)}},
		{name: "the proof written last", proofs: []storedProof{stored(b), stored(a)}, newest: b.Name},
		{name: "a proof that cannot be read: none is trusted", proofs: []storedProof{stored(b), {on: a.Target.Digest}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &keyState{pins: tc.pins, proofs: tc.proofs}
			if got := s.best(); name(got) != tc.best {
				t.Errorf("best = %q; want %q", name(got), tc.best)
			}
			if got := s.newest(); (got == nil && tc.newest != "") || (got != nil && got.Ref != tc.newest) {
				t.Errorf("newest = %+v; want %q", got, tc.newest)
			}
		})
	}
}

func name(img *images.Image) string {
	if img == nil {
		return ""
	}
	return img.Name
}

func TestToRestore(t *testing.T) {
	a, b := pinRecord(testKey, "a", t0), pinRecord(testKey, "b", t0.Add(time.Second))
	cases := []struct {
		name    string
		pins    []images.Image
		proofs  []storedProof
		restore string // the Ref of the proof to restore; "" none
		current string
	}{
		{name: "the pin and its proof", pins: []images.Image{b}, proofs: []storedProof{stored(b)}, current: b.Name},
		{name: "its record went (kubelet's GC)", proofs: []storedProof{stored(b)}, restore: b.Name},
		{name: "a pull took its labels: an older record of the key stands", pins: []images.Image{a}, proofs: []storedProof{stored(b)}, restore: b.Name},
		{name: "a pin written after the proof stands", pins: []images.Image{b}, proofs: []storedProof{stored(a)}, current: b.Name},
		{name: "a proof that cannot be read restores nothing", proofs: []storedProof{{on: b.Target.Digest}}},
		{name: "no proof: the record stands", pins: []images.Image{a}, current: a.Name},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &keyState{pins: tc.pins, proofs: tc.proofs, lease: len(tc.proofs) > 0}
			got := s.toRestore()
			if (got == nil && tc.restore != "") || (got != nil && got.Ref != tc.restore) {
				t.Errorf("toRestore = %+v; want %q", got, tc.restore)
			}
			if got := s.current(); name(got) != tc.current {
				t.Errorf("current = %q; want %q", name(got), tc.current)
			}
		})
	}
}

func TestSettled(t *testing.T) {
	cur := pinRecord(testKey, "a", t0)
	old := pinRecord(testKey, "b", t0.Add(-time.Hour))
	stale := stored(cur)
	stale.PinnedAt = t0.Add(-time.Minute)
	foreign := localOf(testOwn, cur)
	delete(foreign.Labels, LabelLocalPin)
	cases := []struct {
		name string
		own  string
		s    keyState
		want bool
	}{
		{name: "a key with nothing", own: testOwn, want: true},
		{name: "a pin, its proof, its lease and its local name", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur)}, locals: []images.Image{localOf(testOwn, cur)}}, want: true},
		{name: "and a local name of another prefix", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur)}, locals: []images.Image{localOf(testOther, cur), localOf(testOwn, cur)}}, want: true},
		{name: "a store that makes no local name", own: "",
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur)}}, want: true},
		{name: "its local name missing", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur)}}},
		{name: "its local name on the old pin", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur)}, locals: []images.Image{localOf(testOwn, old)}}},
		{name: "its local name without gpupin's marker", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur)}, locals: []images.Image{foreign}}},
		{name: "no lease", own: testOwn,
			s: keyState{pins: []images.Image{cur}, proofs: []storedProof{stored(cur)}, locals: []images.Image{localOf(testOwn, cur)}}},
		{name: "no proof", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, locals: []images.Image{localOf(testOwn, cur)}}},
		{name: "a stale proof of the pin", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stale}, locals: []images.Image{localOf(testOwn, cur)}}},
		{name: "the old pin's proof beside its own", own: testOwn,
			s: keyState{pins: []images.Image{cur}, lease: true, proofs: []storedProof{stored(cur), stored(old)}, locals: []images.Image{localOf(testOwn, cur)}}},
		{name: "no pin, a lease left", own: testOwn, s: keyState{lease: true}},
		{name: "no pin, a local name left", own: testOwn, s: keyState{locals: []images.Image{localOf(testOwn, cur)}}},
		{name: "a proof to restore", own: testOwn, s: keyState{lease: true, proofs: []storedProof{stored(cur)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.settled(testKey, tc.own); got != tc.want {
				t.Errorf("settled = %v; want %v", got, tc.want)
			}
		})
	}
}

func TestWhyNotRestore(t *testing.T) {
	cur := pinRecord(testKey, "a", t0)
	p := proofOf(cur)
	demoted := relabelled(cur, t0)
	demoted.Labels[LabelPrevious] = testKey
	another := relabelled(cur, t0)
	another.Labels[LabelPin] = "other:2"
	moved := cur
	moved.Target.Digest = digest.FromString("b")
	moved.Name = "reg.test/eng@" + moved.Target.Digest.String()
	cases := []struct {
		name string
		rec  images.Image
		why  string // in the reason; "" restored
	}{
		{"a pull took its labels", relabelled(cur, t0.Add(time.Minute)), ""},
		{"its record as it was", cur, ""},
		{"tampered: its target is not its name's", tampered(cur), "changed outside gpupin, never restored"},
		{"another image under the name", moved, "not the image that was proved"},
		{"demoted by gpupin", demoted, "demoted"},
		{"another key's pin now", another, "is the pin of other:2 now"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := whyNotRestore(testKey, p, tc.rec)
			if (tc.why == "") != (got == "") || !strings.Contains(got, tc.why) {
				t.Errorf("whyNotRestore = %q; want %q", got, tc.why)
			}
		})
	}
}

func TestPlanProof(t *testing.T) {
	cur, old := pinRecord(testKey, "a", t0), pinRecord(testKey, "b", t0.Add(-time.Hour))
	stale := stored(cur)
	stale.PinnedAt = t0.Add(-time.Minute)
	cases := []struct {
		name string
		s    keyState
		want proofPlan
	}{
		{"nothing yet: proof and lease, reported", keyState{}, proofPlan{write: true, report: true, lease: true}},
		{"its proof and lease", keyState{lease: true, proofs: []storedProof{stored(cur)}}, proofPlan{}},
		{"its lease lost", keyState{proofs: []storedProof{stored(cur)}}, proofPlan{lease: true}},
		{"a stale proof of it: written again, not reported", keyState{lease: true, proofs: []storedProof{stale}}, proofPlan{write: true}},
		{"a proof of it that cannot be read", keyState{lease: true, proofs: []storedProof{{on: cur.Target.Digest}}}, proofPlan{write: true}},
		{"the old pin's proof: dropped", keyState{lease: true, proofs: []storedProof{stored(old)}},
			proofPlan{write: true, drop: []digest.Digest{old.Target.Digest}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := planProof(cur, &tc.s)
			if got.write != tc.want.write || got.report != tc.want.report || got.lease != tc.want.lease || !equalDigests(got.drop, tc.want.drop) {
				t.Errorf("planProof = %+v; want %+v", got, tc.want)
			}
		})
	}
}

func equalDigests(a, b []digest.Digest) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestForeignLocal(t *testing.T) {
	cur, old := pinRecord(testKey, "a", t0), pinRecord(testKey, "b", t0.Add(-time.Hour))
	demoted := relabelled(old, t0)
	demoted.Labels[LabelPrevious] = testKey
	another := pinRecord("other:2", "a", t0)
	unmarked := localOf(testOwn, cur)
	delete(unmarked.Labels, LabelLocalPin)
	pulled := images.Image{Name: testOwn, Target: cur.Target}
	copied := localOf(testOwn, cur)
	copied.Target = old.Target
	marked := func(imgs ...images.Image) map[string]images.Image {
		m := map[string]images.Image{}
		for _, img := range imgs {
			m[img.Name] = img
		}
		return m
	}
	cases := []struct {
		name   string
		l      images.Image
		cur    *images.Image
		marked map[string]images.Image
		why    string // in the reason; "" gpupin's own
		lost   map[string]bool
	}{
		{"gpupin's, on the pin", localOf(testOwn, cur), &cur, marked(cur), "", nil},
		{"gpupin's, on the pin it names, now demoted", localOf(testOwn, old), &cur, marked(cur, demoted), "", nil},
		{"gpupin's, with no pin now", localOf(testOwn, cur), nil, marked(cur), "", nil},
		{"no gpupin label (a pull of the name, ctr tag)", pulled, &cur, marked(cur), "was not written by gpupin", nil},
		{"from before the marker, on the pin", unmarked, &cur, marked(cur), "", nil},
		{"from before the marker, not on the pin", unmarked, nil, marked(), "carries no io.gpupin.local.pin marker", nil},
		{"names a pin this node does not have", localOf(testOwn, cur), &cur, marked(), "which this node does not have", nil},
		{"names a pin lost here with its image", localOf(testOwn, cur), nil, marked(), "", map[string]bool{testOwn: true}},
		{"names a missing pin, its content here, beside a lost one", localOf(testOwn, cur), nil, marked(), "which this node does not have", map[string]bool{"reg.test/other:1": true}},
		{"names a pin on another target", copied, &cur, marked(cur), "labels copied onto another image", nil},
		{"names a tampered record", localOf(testOwn, cur), &cur, marked(tampered(cur)), "labels copied onto another image", nil},
		{"names another key's pin", localOf(testOwn, another), &cur, marked(another), "which is no pin of eng:1", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := foreignLocal(testKey, tc.l, tc.cur, tc.marked, tc.lost)
			if (tc.why == "") != (got == "") || !strings.Contains(got, tc.why) {
				t.Errorf("foreignLocal = %q; want %q", got, tc.why)
			}
		})
	}
}

// step is what a test says of a localStep.
type step struct {
	op     localOp
	ref    string
	action string
	detail string // in Detail
}

func checkSteps(t *testing.T, got []localStep, want []step) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d steps %+v; want %d %+v", len(got), got, len(want), want)
	}
	for i, w := range want {
		g := got[i]
		if g.op != w.op || g.rec.Name != w.ref || g.done.Ref != w.ref || g.done.Key != testKey || g.done.Action != w.action || !strings.Contains(g.done.Detail, w.detail) {
			t.Errorf("step %d = %s %s %+v; want %+v", i, g.op, g.rec.Name, g.done, w)
		}
	}
}

func TestPlanKeepLocal(t *testing.T) {
	cur, old := pinRecord(testKey, "a", t0), pinRecord(testKey, "b", t0.Add(-time.Hour))
	marked := map[string]images.Image{cur.Name: cur, old.Name: old}
	pulledOwn := images.Image{Name: testOwn, Target: old.Target, Labels: map[string]string{conn.LabelRole: "candidate"}}
	copiedElsewhere := localOf("reg.test/mine:1", old)
	copiedElsewhere.Labels[LabelLocalPin] = "reg.test/eng@sha256:" + strings.Repeat("0", 64)
	unmarked := localOf(testOwn, cur)
	delete(unmarked.Labels, LabelLocalPin)
	cases := []struct {
		name   string
		n      localNaming
		locals []images.Image
		want   []step
	}{
		{"in step", testNaming, []images.Image{localOf(testOwn, cur)}, nil},
		{"none yet: made", testNaming, nil, []step{{localCreate, testOwn, "local", "now " + cur.Name}}},
		{"a store that makes none", localNaming{prefix: DefaultLocalPrefix}, nil, nil},
		{"on the old pin: moved", testNaming, []images.Image{localOf(testOwn, old)}, []step{{localMove, testOwn, "local", "now " + cur.Name}}},
		{"another prefix's on the old pin: moved, and its own made", testNaming, []images.Image{localOf(testOther, old)},
			[]step{{localMove, testOther, "local", "now " + cur.Name}, {localCreate, testOwn, "local", "now " + cur.Name}}},
		{"from before the marker: marked", testNaming, []images.Image{unmarked}, []step{{localMove, testOwn, "local", "now " + cur.Name}}},
		{"a pull of its name: replaced", testNaming, []images.Image{pulledOwn},
			[]step{{localReplace, testOwn, "foreign", "was not written by gpupin (no io.gpupin.local label: a pull of the name, from a peer through a mirror, or ctr tag): replaced by this node's own, on " + cur.Name}}},
		{"gpupin's labels on someone's image: let go", testNaming, []images.Image{copiedElsewhere, localOf(testOwn, cur)},
			[]step{{localUnlabel, copiedElsewhere.Name, "foreign", "which this node does not have (labels copied from another node's record): " + localUnlabeled}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := planKeepLocal(testKey, tc.n, cur, tc.locals, marked, nil)
			checkSteps(t, got, tc.want)
			for _, st := range got {
				switch st.op {
				case localMove, localReplace, localCreate:
					if st.rec.Target.Digest != cur.Target.Digest || !sameLabels(st.rec.Labels, localLabels(testKey, cur)) || len(st.rec.Labels) != len(localLabelKeys) {
						t.Errorf("%s %s writes %v on %s; want the pin's local labels on its target", st.op, st.rec.Name, st.rec.Labels, st.rec.Target.Digest)
					}
				case localUnlabel:
					if st.rec.Labels[LabelLocal] != testKey {
						t.Errorf("unlabel %s: the record is not as it was read", st.rec.Name)
					}
				}
			}
		})
	}
}

func TestPlanClearLocal(t *testing.T) {
	gone := pinRecord(testKey, "a", t0)
	demoted := relabelled(gone, t0)
	demoted.Labels[LabelPrevious] = testKey
	pulledOwn := images.Image{Name: testOwn, Target: gone.Target}
	copiedElsewhere := localOf("reg.test/mine:1", gone)
	cases := []struct {
		name   string
		locals []images.Image
		marked map[string]images.Image
		lost   map[string]bool
		want   []step
	}{
		{"nothing", nil, nil, nil, nil},
		{"gpupin's own, on the pin demoted: removed", []images.Image{localOf(testOwn, gone)}, map[string]images.Image{gone.Name: demoted}, nil,
			[]step{{localDelete, testOwn, "cleared", "no pin: its local name is removed"}}},
		{"gpupin's own, its pin lost with its image: removed", []images.Image{localOf(testOwn, gone)}, nil, map[string]bool{testOwn: true},
			[]step{{localDelete, testOwn, "cleared", "no pin: its local name is removed"}}},
		{"gpupin's own, its pin gone but its content here (labels copied): foreign", []images.Image{localOf(testOwn, gone)}, nil, nil,
			[]step{{localDelete, testOwn, "foreign", "which this node does not have"}}},
		{"a pull of its name: removed", []images.Image{pulledOwn}, nil, nil,
			[]step{{localDelete, testOwn, "foreign", "; this node has no pin of eng:1: " + localRemoved}}},
		{"gpupin's labels on someone's image: taken off", []images.Image{copiedElsewhere}, nil, nil,
			[]step{{localUnlabel, copiedElsewhere.Name, "foreign", "; this node has no pin of eng:1: " + localUnlabeled}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkSteps(t, planClearLocal(testKey, testNaming, tc.locals, tc.marked, tc.lost), tc.want)
		})
	}
}
