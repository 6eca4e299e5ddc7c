package containerd_test

import (
	"context"
	"maps"
	"os/exec"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

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

// target is the descriptor the world's i-th image record points at.
func (w *pinWorld) target(i int) ocispec.Descriptor {
	w.t.Helper()
	img, ok := w.record(w.refs[i])
	if !ok {
		w.t.Fatalf("no record of %s", w.refs[i])
	}
	return img.Target
}
