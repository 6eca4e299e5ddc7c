package pins_test

import (
	"context"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

// The local name points at the pin, moves with a new pin in the same
// step, goes with unpin, and gc keeps it only while it points at a pin.
func TestLocalNameFollowsThePin(t *testing.T) {
	w := newPinWorld(t)
	local := "gpupin.local/eng:1"
	check := func(step, wantRef string) {
		t.Helper()
		p := w.current()
		rec, ok := w.record(local)
		if wantRef == "" {
			if p != nil || ok {
				t.Fatalf("%s: pin %+v, local record present %v; want neither", step, p, ok)
			}
			if held, labelled := w.proofs(); len(held)+len(labelled) != 0 {
				t.Fatalf("%s: proofs left: lease holds %v, labelled %v", step, held, labelled)
			}
			return
		}
		if p == nil || p.Ref != wantRef || p.Local != local {
			t.Fatalf("%s: pin %+v, want %s with local name %s", step, p, wantRef, local)
		}
		if !ok || rec.Target.Digest.String() != digestPart(wantRef) {
			t.Fatalf("%s: local record %v (present %v), want it on %s", step, rec.Target.Digest, ok, wantRef)
		}
		for k, v := range map[string]string{"io.cri-containerd.pinned": "pinned", "io.gpupin.local": "eng:1", "io.gpupin.variant": p.Variant} {
			if rec.Labels[k] != v {
				t.Errorf("%s: local record label %s = %q, want %q", step, k, rec.Labels[k], v)
			}
		}
		held, labelled := w.proofs()
		if len(held) != 1 || held[0] != digestPart(wantRef) || len(labelled) != 1 || labelled[0] != held[0] {
			t.Fatalf("%s: lease holds %v, proof on %v; want only %s", step, held, labelled, digestPart(wantRef))
		}
	}
	w.pin(0)
	check("first pin", w.refs[0])
	w.pin(1)
	check("new pin", w.refs[1])
	col, err := w.rt.GC(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(col.Removed, local) {
		t.Fatalf("gc removed the local name of a pin: %+v", col)
	}
	check("after gc", w.refs[1])
	if _, err := w.rt.Unpin(context.Background(), "eng:1"); err != nil {
		t.Fatal(err)
	}
	check("after unpin", "")
	// Even with its content left, nothing brings an unpinned pin back.
	if _, err := w.rt.GC(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	check("after gc --all", "")
}

// ctr pulls of the pinned reference into gpupin's namespace: each
// daemon's own ctr, through its default path (2.x: the transfer service)
// and, on 2.x, the client-side one too. The pull replaces the record's
// labels but leaves the manifest's content labels alone; the next Pins
// puts the pin back.
func TestPinSurvivesCtrPull(t *testing.T) {
	d := testenv.Containerd(t)
	pulls := [][]string{{"images", "pull", "--plain-http"}}
	if d.Major >= 2 {
		pulls = append(pulls, []string{"images", "pull", "--plain-http", "--local"})
	}
	for _, args := range pulls {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			w := newPinWorld(t)
			p := w.pin(0)
			cmd := exec.Command(d.Ctr(), append([]string{"--address", d.Address, "--namespace", w.rt.Namespace()}, append(args, p.Ref)...)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("ctr %v: %v\n%s", args, err, out)
			}
			rec, _ := w.record(p.Ref)
			t.Logf("containerd %s, ctr %s: record labels after the pull: %v", d.Version, strings.Join(args, " "), rec.Labels)
			if rec.Labels[containerd.LabelPin] == "eng:1" {
				t.Logf("this pull kept the record's labels")
			}
			info, err := w.rt.Client().ContentStore().Info(w.nsctx(), rec.Target.Digest)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("manifest content labels after the pull: %v", info.Labels)
			if info.Labels["io.gpupin.proof/eng:1"] == "" {
				t.Fatalf("the pull took the proof off the manifest's content: %v", info.Labels)
			}
			got := w.current()
			if got == nil || got.Ref != p.Ref || got.Variant != "cu13" || got.Node != "sha256-node" || got.Local != "gpupin.local/eng:1" {
				t.Fatalf("after the pull, Pins gives %+v; want the pin back", got)
			}
			if rec, _ := w.record(p.Ref); rec.Labels[containerd.LabelCRIPinned] != "pinned" || rec.Labels[containerd.LabelVerdict] != `{"ok":true}` {
				t.Fatalf("restored labels: %v", rec.Labels)
			}
		})
	}
}

// A pin whose record another client deleted comes back from the content
// its lease kept; one that was demoted, unpinned or tampered never does.
func TestRecoverRestoresOnlyWhatWasTaken(t *testing.T) {
	ctx := context.Background()
	del := func(w *pinWorld, names ...string) {
		t.Helper()
		for _, n := range names {
			// Synchronous: the collection runs now, so what no lease or
			// record holds is gone before Recover looks.
			if err := w.rt.Client().ImageService().Delete(w.nsctx(), n, images.SynchronousDelete()); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		do      func(w *pinWorld)
		wantRef func(w *pinWorld) string // "" = no pin
		action  string
	}{
		{"deleted record comes back", func(w *pinWorld) {
			w.pin(0)
			del(w, w.refs[0], "gpupin.local/eng:1")
		}, func(w *pinWorld) string { return w.refs[0] }, "recreated"},
		{"relabelled record comes back", func(w *pinWorld) {
			w.pin(0)
			rec, _ := w.record(w.refs[0])
			rec.Labels = map[string]string{"io.cri-containerd.image": "managed"}
			if _, err := w.rt.Client().ImageService().Update(w.nsctx(), rec); err != nil {
				t.Fatal(err)
			}
		}, func(w *pinWorld) string { return w.refs[0] }, "relabelled"},
		{"only the newest pin comes back", func(w *pinWorld) {
			w.pin(0)
			w.pin(1)
			del(w, w.refs[1], w.refs[0])
		}, func(w *pinWorld) string { return w.refs[1] }, "recreated"},
		{"unpinned, then deleted", func(w *pinWorld) {
			w.pin(0)
			if _, err := w.rt.Unpin(ctx, "eng:1"); err != nil {
				t.Fatal(err)
			}
			del(w, w.refs[0])
		}, func(*pinWorld) string { return "" }, ""},
		{"a newer proof whose content is gone stops an older one", func(w *pinWorld) {
			// The state a pin step cut short could leave, had the newer
			// manifest then been deleted by hand: the old proof is back on
			// its manifest in the lease, beside the new one, whose content
			// goes. The old pin was replaced: it must not come back.
			w.pin(0)
			cs := w.rt.Client().ContentStore()
			d0 := digest.Digest(digestPart(w.refs[0]))
			info, err := cs.Info(w.nsctx(), d0)
			if err != nil {
				t.Fatal(err)
			}
			stale := info.Labels["io.gpupin.proof/eng:1"]
			w.pin(1)
			info.Labels = map[string]string{"io.gpupin.proof/eng:1": stale}
			if _, err := cs.Update(w.nsctx(), info, "labels.io.gpupin.proof/eng:1"); err != nil {
				t.Fatal(err)
			}
			ls := w.rt.Client().LeasesService()
			all, _ := ls.List(w.nsctx(), `labels."io.gpupin.role"==pin`)
			if len(all) != 1 {
				t.Fatalf("pin leases: %v", all)
			}
			if err := ls.AddResource(w.nsctx(), all[0], leases.Resource{ID: d0.String(), Type: "content"}); err != nil {
				t.Fatal(err)
			}
			del(w, w.refs[1], w.refs[0], "gpupin.local/eng:1")
			if err := cs.Delete(w.nsctx(), digest.Digest(digestPart(w.refs[1]))); err != nil {
				t.Fatal(err)
			}
		}, func(*pinWorld) string { return "" }, ""},
		{"tampered", func(w *pinWorld) {
			w.pin(0)
			rec, _ := w.record(w.refs[0])
			other, _ := w.record(w.refs[1])
			rec.Target = other.Target
			if _, err := w.rt.Client().ImageService().Update(w.nsctx(), rec, "target"); err != nil {
				t.Fatal(err)
			}
			if p, err := w.rt.GetPin(ctx, "eng:1"); err == nil {
				t.Fatalf("a tampered record answers: %+v", p)
			}
			// gc removes the tampered record; its proof went with the look.
			if _, err := w.rt.GC(ctx, true); err != nil {
				t.Fatal(err)
			}
		}, func(*pinWorld) string { return "" }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newPinWorld(t)
			tc.do(w)
			done, err := w.rt.Recover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("recovered: %+v", done)
			want := tc.wantRef(w)
			p := w.current()
			if want == "" {
				if p != nil {
					t.Fatalf("pin %+v came back", p)
				}
				if _, ok := w.record("gpupin.local/eng:1"); ok {
					t.Fatal("a local name without a pin")
				}
				return
			}
			if p == nil || p.Ref != want || p.Restored.IsZero() || p.Local != "gpupin.local/eng:1" {
				t.Fatalf("pin %+v, want %s restored with its local name", p, want)
			}
			found := false
			for _, r := range done {
				found = found || (r.Action == tc.action && r.Ref == want)
			}
			if !found {
				t.Errorf("Recover said %+v; want %s of %s", done, tc.action, want)
			}
			// It runs from the restored record.
			res, err := w.rt.Run(ctx, containerd.RunSpec{Image: p.Ref, Args: []string{"/bin/sh", "-c", "echo $VARIANT"}, Hardened: true, Role: "probe", Timeout: 30 * time.Second})
			if err != nil || !strings.Contains(string(res.Output), p.Variant) {
				t.Fatalf("run the restored pin: %v: %s", err, res.Output)
			}
		})
	}
}

// A verdict as long as a label may be still leaves a proof that fits
// containerd's label limit, and the pin comes back from it.
func TestRecoverLongVerdict(t *testing.T) {
	w := newPinWorld(t)
	ctx := context.Background()
	long := `{"ok":true,"simulated_checks":["` + strings.Repeat(`x\"`, 1800) + `"]}`
	p := containerd.Pin{Key: "eng:1", Ref: w.refs[0], Variant: "cu13", Source: w.source, Override: "auto", Node: "sha256-node",
		ProbedAt: time.Now(), Probe: "exec", Verdict: long}
	if err := w.rt.SetPin(ctx, p, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, labelled := w.proofs(); len(labelled) != 1 {
		t.Fatalf("no proof written for a long verdict: %v", labelled)
	}
	if err := w.rt.Client().ImageService().Delete(w.nsctx(), w.refs[0], images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	got := w.current()
	if got == nil || got.Ref != w.refs[0] || got.Restored.IsZero() || !strings.HasPrefix(got.Verdict, `{"ok":true`) {
		t.Fatalf("pin %+v: want it restored", got)
	}
}

// A record of a local name that gpupin did not write on this node (a
// pull of gpupin.local/… that a peer-to-peer mirror served from another
// node, a ctr tag, one made by hand, with or without gpupin's labels
// copied) never counts as the pin: the next Recover replaces it with the
// node's own where the node has a pin of the key, removes it where it has
// none, and reports each as foreign.
func TestForeignLocalRecords(t *testing.T) {
	const local = "gpupin.local/eng:1"
	type made struct {
		name   string
		target int // index of the image in the world's refs
		labels func(own images.Image) map[string]string
	}
	noLabels := func(images.Image) map[string]string {
		// What a CRI pull writes on a record it makes.
		return map[string]string{"io.cri-containerd.image": "managed"}
	}
	copied := func(own images.Image) map[string]string { return maps.Clone(own.Labels) }
	otherNode := func(own images.Image) map[string]string {
		l := maps.Clone(own.Labels)
		l[containerd.LabelLocalPin] = "registry.example/org/eng@sha256:" + strings.Repeat("ab", 32)
		return l
	}
	tests := []struct {
		name string
		make made
		// want: the record after Recover: "own" (on the pin, with the
		// marker), "gone", or "bare" (still there, gpupin's labels off).
		want string
	}{
		{"pulled from a peer, over the pin's own name", made{local, 1, noLabels}, "own"},
		{"labels copied onto another image", made{local, 1, copied}, "own"},
		{"labels of another node's record", made{local, 1, otherNode}, "own"},
		{"a key this node has no pin of", made{"gpupin.local/other:2", 1, noLabels}, "gone"},
		{"copied labels, a key without a pin", made{"gpupin.local/other:2", 1, func(own images.Image) map[string]string {
			l := copied(own)
			l[containerd.LabelLocal] = "other:2"
			return l
		}}, "gone"},
		{"a name gpupin never writes", made{"gpupin.local/a/b@sha256:" + strings.Repeat("cd", 32), 1, noLabels}, "gone"},
		{"labels copied onto someone's image", made{"registry.example/team/tool:1", 1, copied}, "bare"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newPinWorld(t)
			pin := w.pin(0)
			ctx := w.nsctx()
			is := w.rt.Client().ImageService()
			own, ok := w.record(local)
			if !ok || own.Labels[containerd.LabelLocalPin] != pin.Ref {
				t.Fatalf("the pin's local record: present %v, labels %v; want the marker %s", ok, own.Labels, pin.Ref)
			}
			target := w.target(tc.make.target)
			rec := images.Image{Name: tc.make.name, Target: target, Labels: tc.make.labels(own)}
			if err := is.Delete(ctx, rec.Name); err != nil && !errdefs.IsNotFound(err) {
				t.Fatal(err)
			}
			if _, err := is.Create(ctx, rec); err != nil {
				t.Fatal(err)
			}
			// Until Recover runs, the record is not the pin's local name.
			pins, err := w.rt.ListPins(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pins {
				if p.Key == "eng:1" && p.Local != "" && tc.make.name == local {
					t.Fatalf("ListPins counts the foreign record %s as the pin's local name", p.Local)
				}
			}
			done, err := w.rt.Recover(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var report *containerd.Recovered
			for i := range done {
				if done[i].Ref == tc.make.name && done[i].Action == "foreign" {
					report = &done[i]
				}
			}
			if report == nil {
				t.Fatalf("Recover reported %+v; want %s reported foreign", done, tc.make.name)
			}
			t.Logf("reported: %+v", *report)
			after, present := w.record(tc.make.name)
			switch tc.want {
			case "own":
				if !present || after.Target.Digest != digest.Digest(digestPart(pin.Ref)) || after.Labels[containerd.LabelLocalPin] != pin.Ref || after.Labels[containerd.LabelLocal] != "eng:1" {
					t.Fatalf("after Recover: present %v, on %s, labels %v; want it on the pin %s with gpupin's marker", present, after.Target.Digest, after.Labels, pin.Ref)
				}
				for _, k := range []string{containerd.LabelRole, containerd.LabelOwner, "io.cri-containerd.image"} {
					if _, ok := after.Labels[k]; ok {
						t.Errorf("label %s of the foreign record kept: %v", k, after.Labels)
					}
				}
				if !strings.Contains(report.Detail, "replaced") {
					t.Errorf("report %q does not say the record was replaced", report.Detail)
				}
			case "gone":
				if present {
					t.Fatalf("after Recover %s is still there, on %s, labels %v", tc.make.name, after.Target.Digest, after.Labels)
				}
			case "bare":
				if !present || after.Target.Digest != target.Digest {
					t.Fatalf("after Recover: present %v, on %s; want someone's record left where it was", present, after.Target.Digest)
				}
				for _, k := range []string{containerd.LabelLocal, containerd.LabelLocalPin, containerd.LabelCRIPinned, containerd.LabelManaged} {
					if _, ok := after.Labels[k]; ok {
						t.Errorf("label %s left on %s: %v", k, tc.make.name, after.Labels)
					}
				}
			}
			// The pin and its own local name are untouched.
			if p := w.current(); p == nil || p.Ref != pin.Ref || p.Local != local {
				t.Fatalf("after Recover the pin is %+v; want %s with local name %s", p, pin.Ref, local)
			}
			if again, err := w.rt.Recover(context.Background()); err != nil || len(again) != 0 {
				t.Fatalf("a second Recover did %+v (err %v); want nothing left to do", again, err)
			}
		})
	}
}

// ctr images tag --force over the local name (as an operator might) is
// a record gpupin did not write: the next Recover puts the node's own back.
func TestForeignLocalRecordByCtrTag(t *testing.T) {
	d := testenv.Containerd(t)
	w := newPinWorld(t)
	pin := w.pin(0)
	const local = "gpupin.local/eng:1"
	cmd := exec.Command(d.Ctr(), "--address", d.Address, "--namespace", w.rt.Namespace(), "images", "tag", "--force", w.refs[1], local)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ctr images tag: %v\n%s", err, out)
	}
	if rec, _ := w.record(local); rec.Target.Digest.String() != digestPart(w.refs[1]) {
		t.Fatalf("ctr tag left %s on %s; want it on %s", local, rec.Target.Digest, w.refs[1])
	}
	if rec, _ := w.record(local); true {
		t.Logf("ctr tag wrote labels %v", rec.Labels)
	}
	done, err := w.rt.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].Action != "foreign" || done[0].Ref != local || done[0].Key != "eng:1" {
		t.Fatalf("Recover did %+v; want one foreign report for %s", done, local)
	}
	if p := w.current(); p == nil || p.Ref != pin.Ref || p.Local != local {
		t.Fatalf("after Recover the pin is %+v; want %s with local name %s", p, pin.Ref, local)
	}
	if rec, _ := w.record(local); rec.Labels[containerd.LabelRole] != "" || rec.Labels[containerd.LabelOwner] != "" {
		t.Fatalf("the local record kept the candidate labels ctr copied: %v", rec.Labels)
	}
}

// A local record made before gpupin marked its own (io.gpupin.local on the
// pin's target, no marker) is gpupin's: it gets the marker, quietly.
func TestLocalRecordWithoutMarkerIsAdopted(t *testing.T) {
	w := newPinWorld(t)
	pin := w.pin(0)
	const local = "gpupin.local/eng:1"
	rec, _ := w.record(local)
	delete(rec.Labels, containerd.LabelLocalPin)
	if _, err := w.rt.Client().ImageService().Update(w.nsctx(), rec, "labels."+containerd.LabelLocalPin); err != nil {
		t.Fatal(err)
	}
	done, err := w.rt.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].Action != "local" {
		t.Fatalf("Recover did %+v; want the local name marked, not reported foreign", done)
	}
	if rec, _ := w.record(local); rec.Labels[containerd.LabelLocalPin] != pin.Ref {
		t.Fatalf("labels after Recover: %v; want the marker %s", rec.Labels, pin.Ref)
	}
}
