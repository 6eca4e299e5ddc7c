package pins_test

import (
	"context"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

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
		ref := ctrtest.Pushed(t, w.reg, env)
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

func (w *pinWorld) nsctx() context.Context {
	return namespaces.WithNamespace(context.Background(), w.rt.Namespace())
}

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

// target is the descriptor the world's i-th image record points at.
func (w *pinWorld) target(i int) ocispec.Descriptor {
	w.t.Helper()
	img, ok := w.record(w.refs[i])
	if !ok {
		w.t.Fatalf("no record of %s", w.refs[i])
	}
	return img.Target
}

type contentInfo = content.Info

func digestPart(ref string) string { _, d, _ := strings.Cut(ref, "@"); return d }

// deadOwner is the owner label of a process that has exited.
func deadOwner(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	owner := containerd.OwnerOf(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	return owner
}
