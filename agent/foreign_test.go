package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A node whose hosts configuration has a mirror for every registry (as
// Spegel writes by default): the agent warns at start and says what to add
// to the mirror's filters. Records of a local name that gpupin did not
// write (a peer's image pulled under the pin's own name; a local name of
// an engine this node has no pin of) are replaced or removed within a
// sweep period, and each is reported: a warning in the log, the status's
// count and last reports, and a metric.
func TestRunSimulatedReplacesForeignLocalNames(t *testing.T) {
	reg, ref := publishDemo(t)
	_, port, _ := strings.Cut(reg.Host, ":")
	hosts := testenv.HostsToml(t, "", "_default", fmt.Sprintf("[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://localhost:"+port))
	rt := testenv.Runtime(t, containerd.WithRegistry(registry.New(registry.Config{HostsDir: hosts})))
	logs := &testenv.LogBuffer{}
	metricsAddr := freeAddr(t)
	const every = 100 * time.Millisecond
	r := startRun(t, agent.RunConfig{Runtime: rt, Provision: simulated(t), MetricsAddress: metricsAddr,
		Options: agent.Options{NoOverridesFile: true, SweepEvery: every, Logger: slog.New(slog.NewTextHandler(logs, nil))},
		Wants:   []provision.Want{{Engine: "demo", Version: "1.0", Ref: ref}}})
	if !strings.Contains(logs.String(), `node-local names: `) || !strings.Contains(logs.String(), `^gpupin\\.local/`) {
		t.Errorf("no warning at start of the mirror that serves every registry:\n%s", logs.String())
	}
	r.waitFor(t, 60*time.Second, "ready", one(provision.Ready, "cu129"))
	pin, err := rt.GetPin(context.Background(), "demo:1.0")
	if err != nil || pin == nil || pin.Local != "gpupin.local/demo:1.0" {
		t.Fatalf("pin %+v, %v", pin, err)
	}

	nsctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	is := rt.Client().ImageService()
	// Another node's image, as a pull through the mirror leaves it: no labels of gpupin's.
	peer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("a peer's variant"), Size: 16}
	if err := is.Delete(nsctx, pin.Local, images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{pin.Local, "gpupin.local/other:2.0"} {
		if _, err := is.Create(nsctx, images.Image{Name: name, Target: peer, Labels: map[string]string{"io.cri-containerd.image": "managed"}}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 50*every+5*time.Second, "the local name back on the pin, the other removed", func() bool {
		own, err1 := is.Get(nsctx, pin.Local)
		_, err2 := is.Get(nsctx, "gpupin.local/other:2.0")
		return err1 == nil && own.Target.Digest.String() == pin.Digest && err2 != nil
	})
	waitUntil(t, 5*time.Second, "both reported", func() bool { n, _ := r.agent.Foreign(); return n >= 2 })
	n, last := r.agent.Foreign()
	refs := map[string]bool{}
	for _, f := range last {
		refs[f.Ref] = true
		t.Logf("reported %s: %s", f.Ref, f.Detail)
	}
	if n != 2 || !refs[pin.Local] || !refs["gpupin.local/other:2.0"] {
		t.Errorf("reported %d: %+v; want the two records", n, last)
	}
	if got := strings.Count(logs.String(), "foreign record of a node-local name"); got != 2 {
		t.Errorf("%d warnings of foreign records in the log, want 2:\n%s", got, logs.String())
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "gpupin_foreign_local_names_total 2") {
		t.Errorf("metrics lack the count of foreign records:\n%s", body)
	}
	// The engine stays ready on its own pin.
	if p, err := rt.GetPin(context.Background(), "demo:1.0"); err != nil || p == nil || p.Digest != pin.Digest || p.Local != pin.Local {
		t.Fatalf("pin after the sweep %+v, %v", p, err)
	}
}
