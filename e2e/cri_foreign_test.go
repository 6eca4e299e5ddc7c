package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
)

// What a node gets when a mirror serves gpupin.local/… (a peer-to-peer
// mirror that mirrors every registry does): the CRI plugin's own pull, as
// kubelet makes for an IfNotPresent pod, writes a record of the local name
// on another node's image. Here certs.d names a registry as the mirror of
// gpupin.local, through containerd's own hosts configuration, and that
// registry holds the "peer's" image under the name. The next Recover puts
// the node's own image back under the pin's local name, removes the name
// of an engine the node has no pin of, and reports both as foreign.
func TestCRISimulatedPulledLocalNameIsForeign(t *testing.T) {
	e := newCRIEnv(t, sandbox.DefaultSandboxImage)
	ctx := context.Background()
	certsD := filepath.Join(e.dir, "certs.d")
	os.MkdirAll(filepath.Join(certsD, containerd.DefaultLocalPrefix), 0o755)
	hosts := fmt.Sprintf("[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+e.reg.Host)
	if err := os.WriteFile(filepath.Join(certsD, containerd.DefaultLocalPrefix, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	push := func(ref string, env string) string {
		img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{env}, Entrypoint: []string{"sleep", "3600"}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := sandbox.PushImage(ctx, ref, img)
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	own := push(e.reg.Host+"/own:1", "VARIANT=cu129")
	peer := push(e.reg.Host+"/demo:1.0", "VARIANT=cu13")
	push(e.reg.Host+"/other:1.0", "VARIANT=cu13")
	ownRef := e.reg.Host + "/own@" + own
	if _, err := e.rt.Pull(ctx, ownRef, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.SetPin(ctx, containerd.Pin{Key: "demo:1.0", Ref: ownRef, Variant: "cu129", Source: ownRef, Node: "sha256-node", ProbedAt: time.Now()}, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	is := e.rt.Client().ImageService()
	local := containerd.DefaultLocalPrefix + "/demo:1.0"
	if rec, err := is.Get(e.ctx(), local); err != nil || rec.Target.Digest.String() != own {
		t.Fatalf("local name before the pull: %v on %s, want it on %s", err, rec.Target.Digest, own)
	}
	for _, name := range []string{local, containerd.DefaultLocalPrefix + "/other:1.0"} {
		e.must("pull", name)
	}
	rec, err := is.Get(e.ctx(), local)
	if err != nil || rec.Target.Digest.String() != peer {
		t.Fatalf("crictl pull %s: %v, on %s; want the peer's %s", local, err, rec.Target.Digest, peer)
	}
	t.Logf("containerd %s: the CRI pull left %s on the peer's image, labels %v", e.d.Version, local, rec.Labels)
	if p, err := e.rt.ListPins(ctx); err != nil || len(p) != 1 || p[0].Local != "" {
		t.Fatalf("pins before Recover %+v, %v: want the pin without a local name", p, err)
	}
	done, err := e.rt.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	foreign := map[string]bool{}
	for _, d := range done {
		if d.Action == "foreign" {
			foreign[d.Ref] = true
		}
	}
	if !foreign[local] || !foreign[containerd.DefaultLocalPrefix+"/other:1.0"] {
		t.Fatalf("Recover did %+v; want both pulled names reported foreign", done)
	}
	if rec, err := is.Get(e.ctx(), local); err != nil || rec.Target.Digest.String() != own || rec.Labels[containerd.LabelLocalPin] != ownRef {
		t.Fatalf("after Recover %s: %v, on %s, labels %v; want the node's own", local, err, rec.Target.Digest, rec.Labels)
	}
	if found, _, _ := e.inspecti(containerd.DefaultLocalPrefix + "/other:1.0"); found {
		t.Fatal("the CRI plugin still has the local name of an engine this node has no pin of")
	}
	if found, _, raw := e.inspecti(local); !found {
		t.Fatalf("the CRI plugin lost %s: %s", local, raw)
	}
}
