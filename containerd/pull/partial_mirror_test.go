package pull_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/internal/ctrtest"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/registry"
)

// Where containerd's hosts configuration names a mirror for the pulled
// reference's registry (its own hosts.toml, or _default's), the layers a
// pull extracts are stored, so a peer-to-peer mirror can serve them from
// this node; elsewhere they are streamed without being stored (on a
// daemon whose layers gpupin extracts itself in parallel; every layer is
// stored otherwise). The mirror here is the same registry under another
// name, so every pull succeeds whichever host serves it.
func TestLayersKeptWhereAMirrorServes(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	_, port, _ := strings.Cut(reg.Host, ":")
	server := fmt.Sprintf("server = %q\n", "http://"+reg.Host)
	mirror := fmt.Sprintf("\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://localhost:"+port)
	tests := []struct {
		name       string
		dir, body  string // hosts.toml under dir; "" none
		mirrored   bool
		keepLayers bool
	}{
		{"no hosts configuration", "", "", false, false},
		{"the registry's own server only", reg.Host, server, false, false},
		{"a mirror for the registry", reg.Host, server + mirror, true, false},
		{"a mirror in _default", "_default", mirror, true, false},
		{"a mirror for another registry", "registry.example", mirror, false, false},
		{"--keep-layers without a mirror", "", "", false, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hosts := t.TempDir()
			if tc.dir != "" {
				testenv.HostsToml(t, hosts, tc.dir, tc.body)
			}
			layer, err := sandbox.RandomLayer(256 << 10)
			if err != nil {
				t.Fatal(err)
			}
			ref := ctrtest.PushImage(t, reg, fmt.Sprintf("mirrored%d:1", i), sandbox.ImageSpec{Layers: []v1.Layer{layer}})
			rt := testenv.Runtime(t, containerd.WithRegistry(registry.New(registry.Config{HostsDir: hosts})), containerd.WithKeepLayers(tc.keepLayers))
			ls, err := rt.LayerStorage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("layer storage: %s", ls.Summary)
			if got := len(ls.Mirrored) > 0; got != tc.mirrored && tc.dir != "registry.example" {
				t.Errorf("LayerStorage lists mirrors %+v; want mirrored=%v", ls.Mirrored, tc.mirrored)
			}
			if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}
			ld, _ := layer.Digest()
			_, err = rt.Client().ContentStore().Info(namespaces.WithNamespace(ctx, rt.Namespace()), digest.Digest(ld.String()))
			stored := err == nil
			if err != nil && !errdefs.IsNotFound(err) {
				t.Fatal(err)
			}
			want := tc.mirrored || tc.keepLayers || !ls.Streamed
			if !ls.Streamed {
				// Root on overlayfs: every containerd extracts here in
				// parallel (with rebase from 2.2, by a move below it).
				t.Errorf("LayerStorage says not streamed: %s", ls.Summary)
			}
			if stored != want {
				t.Fatalf("layer stored %v, want %v (mirrored %v, keep %v, streamed %v)", stored, want, tc.mirrored, tc.keepLayers, ls.Streamed)
			}
		})
	}
}
