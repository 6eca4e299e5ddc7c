package containerd_test

import (
	"context"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestLocalName(t *testing.T) {
	tests := []struct {
		prefix, key, want string
		hashed            bool // a hash of the key is appended
		err               bool
	}{
		{"", "vllm:0.11.0", "gpupin.local/vllm:0.11.0", false, false},
		{"gpupin.local", "sglang:0.5.0rc1", "gpupin.local/sglang:0.5.0rc1", false, false},
		{"registry.internal:5000/node", "llama.cpp:b4500", "registry.internal:5000/node/llama.cpp:b4500", false, false},
		{"localhost", "trt-llm:1.0", "localhost/trt-llm:1.0", false, false},
		// '+' (semantic versions' build metadata) is no tag character.
		{"", "vllm:0.11.0+cu129", "gpupin.local/vllm:0.11.0_cu129-", true, false},
		// A key named by a digest.
		{"", "eng:sha256:0123456789a", "gpupin.local/eng:sha256_0123456789a-", true, false},
		// Separators a repository component may not end with.
		{"", "eng-:1", "gpupin.local/eng-", true, false},
		{"", "a..b:1", "gpupin.local/a-b-", true, false},
		{"", "novel", "", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			got, err := containerd.LocalName(tc.prefix, tc.key)
			if tc.err {
				if err == nil {
					t.Fatalf("LocalName(%q) = %q, want an error", tc.key, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.hashed && !strings.HasPrefix(got, tc.want) || !tc.hashed && got != tc.want {
				t.Fatalf("LocalName(%q, %q) = %q, want %q", tc.prefix, tc.key, got, tc.want)
			}
			if again, _ := containerd.LocalName(tc.prefix, tc.key); again != got {
				t.Fatalf("not stable: %q then %q", got, again)
			}
		})
	}
	// Keys the mapping changes never meet keys it keeps.
	a, _ := containerd.LocalName("", "vllm:1.0+a")
	b, _ := containerd.LocalName("", "vllm:1.0_a")
	if a == b {
		t.Fatalf("two keys share %s", a)
	}
}

func TestLocalPrefixIsChecked(t *testing.T) {
	d := testenv.Containerd(t)
	for _, tc := range []struct {
		prefix string
		ok     bool
	}{
		{"gpupin.local", true},
		{"registry.internal/gpupin/node", true},
		{"vllm", false}, // would normalise to docker.io/library/…
		{"bad host", false},
	} {
		rt, err := containerd.Connect(context.Background(), d.Address, containerd.WithLocalPrefix(tc.prefix))
		if (err == nil) != tc.ok {
			t.Errorf("prefix %q: err = %v, want ok=%v", tc.prefix, err, tc.ok)
		}
		if rt != nil {
			rt.Close()
		}
	}
}

func TestCRIPinningOf(t *testing.T) {
	for _, tc := range []struct {
		version string
		kept    bool
	}{
		{"1.6.20~ds1", false}, {"v1.6.38", false}, {"1.7.27", true}, {"2.4.2+unknown", true}, {"v2.0.0", true},
	} {
		if got := containerd.CRIPinningOf(tc.version); got.Kept != tc.kept || got.Note == "" {
			t.Errorf("CRIPinningOf(%q) = %+v, want kept=%v", tc.version, got, tc.kept)
		}
	}
}

// pinWorld is a runtime with two pulled images of one engine, ready to pin.
type pinWorld struct {
	t      *testing.T
	rt     *containerd.Runtime
	reg    *sandbox.Registry
	refs   []string
	source string
}

func newPinWorld(t *testing.T, opts ...containerd.Opt) *pinWorld {
	t.Helper()
	w := &pinWorld{t: t, reg: testenv.Registry(t), rt: testenv.Runtime(t, opts...)}
	w.source = w.reg.Host + "/eng:1"
	for _, env := range []string{"VARIANT=cu13", "VARIANT=cu129"} {
		ref := pushed(t, w.reg, env)
		if _, err := w.rt.Pull(context.Background(), ref, containerd.PullOptions{}); err != nil {
			t.Fatal(err)
		}
		w.refs = append(w.refs, ref)
	}
	return w
}

func (w *pinWorld) pin(i int) containerd.Pin {
	w.t.Helper()
	p := containerd.Pin{Key: "eng:1", Ref: w.refs[i], Variant: []string{"cu13", "cu129"}[i], Source: w.source,
		Override: "auto", Node: "sha256-node", ProbedAt: time.Now(), Probe: "cuda", Verdict: `{"ok":true}`}
	if err := w.rt.SetPin(context.Background(), p, containerd.SetPinOptions{}); err != nil {
		w.t.Fatal(err)
	}
	return p
}

func (w *pinWorld) nsctx() context.Context { return withNS(context.Background(), w.rt.Namespace()) }

func (w *pinWorld) record(name string) (images.Image, bool) {
	img, err := w.rt.Client().ImageService().Get(w.nsctx(), name)
	return img, err == nil
}

// current is the pin of eng:1 as Pins (which recovers) sees it.
func (w *pinWorld) current() *containerd.Pin {
	w.t.Helper()
	p, err := w.rt.GetPin(context.Background(), "eng:1")
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// proofs lists the content the key's lease holds, and which of it carries
// the key's proof.
func (w *pinWorld) proofs() (held []string, labelled []string) {
	w.t.Helper()
	ctx := w.nsctx()
	ls := w.rt.Client().LeasesService()
	all, err := ls.List(ctx, `labels."io.gpupin.role"==pin`)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, l := range all {
		res, _ := ls.ListResources(ctx, l)
		for _, r := range res {
			held = append(held, r.ID)
		}
	}
	w.rt.Client().ContentStore().Walk(ctx, func(info contentInfo) error {
		if info.Labels["io.gpupin.proof/eng:1"] != "" {
			labelled = append(labelled, info.Digest.String())
		}
		return nil
	})
	sort.Strings(held)
	sort.Strings(labelled)
	return held, labelled
}

type contentInfo = content.Info

func digestPart(ref string) string { _, d, _ := strings.Cut(ref, "@"); return d }

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
	if contains(col.Removed, local) {
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

// A prefix of the runtime's own: the name is made under it; a name that
// another prefix made moves along.
func TestLocalPrefixOption(t *testing.T) {
	w := newPinWorld(t, containerd.WithLocalPrefix("node.example/gpupin"))
	w.pin(0)
	if p := w.current(); p == nil || p.Local != "node.example/gpupin/eng:1" {
		t.Fatalf("pin %+v, want local name node.example/gpupin/eng:1", p)
	}
	other, err := containerd.Connect(context.Background(), testenv.Containerd(t).Address,
		containerd.WithNamespace(w.rt.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.SetPin(context.Background(), containerd.Pin{Key: "eng:1", Ref: w.refs[1], Source: w.source, Node: "sha256-node", ProbedAt: time.Now()}, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node.example/gpupin/eng:1", "gpupin.local/eng:1"} {
		rec, ok := w.record(name)
		if !ok || rec.Target.Digest.String() != digestPart(w.refs[1]) {
			t.Errorf("%s: present %v, on %s; want it on the new pin", name, ok, rec.Target.Digest)
		}
	}
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
			d0 := digestOf(digestPart(w.refs[0]))
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
			if err := cs.Delete(w.nsctx(), digestOf(digestPart(w.refs[1]))); err != nil {
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
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
