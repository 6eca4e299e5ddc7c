package provision_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// upstream is a registry name no DNS knows: only certs.d reaches it.
const upstream = "registry.gpupin.invalid"

// mirrorProvisioner provisions through a certs.d directory whose
// hosts.toml for upstream is body.
func mirrorProvisioner(t *testing.T, body string) (*provision.Provisioner, *containerd.Runtime) {
	t.Helper()
	policy := registry.New(registry.Config{HostsDir: testenv.HostsToml(t, "", upstream, body)})
	rt := testenv.Runtime(t, containerd.WithRegistry(policy))
	return testenv.Provisioner(t, rt, testOptions(t, testenv.NewNode(h100("575.57.08", "12.9")))...), rt
}

// mirrorOf is hosts.toml sending upstream to mirror for resolving and
// pulling.
func mirrorOf(mirror string) string {
	return fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", upstream, mirror)
}

// An engine reachable only through its mirror is provisioned, and the pin
// keeps the upstream name: the record's name, its io.gpupin.source, the
// status. The mirror's address is named nowhere (nodes with another mirror
// must agree on the pin). On both registry implementations.
func TestProvisionSimulatedThroughMirrorKeepsUpstreamName(t *testing.T) {
	ctx := context.Background()
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu13, cu129}); err != nil {
				t.Fatal(err)
			}
			p, rt := mirrorProvisioner(t, mirrorOf(reg.Host))
			ref := upstream + "/demo:1.0"
			st := p.Provision(ctx, provision.Want{Ref: ref})
			if st.State != provision.Ready || st.Variant != "cu129" {
				t.Fatalf("%s", st)
			}
			if !strings.HasPrefix(st.Pinned, upstream+"/demo@sha256:") || st.Pin == nil || st.Pin.Source != ref {
				t.Fatalf("pinned %s, pin %+v: want the upstream name", st.Pinned, st.Pin)
			}
			img, err := rt.Client().ImageService().Get(testenv.Context(rt), st.Pinned)
			if err != nil {
				t.Fatalf("no record under the upstream name %s: %v", st.Pinned, err)
			}
			if got := img.Labels[containerd.LabelSource]; got != ref {
				t.Errorf("%s = %q, want %q", containerd.LabelSource, got, ref)
			}
			all, err := rt.Client().ImageService().List(testenv.Context(rt))
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range all {
				if strings.Contains(im.Name, reg.Host) {
					t.Errorf("a record is named by the mirror: %s", im.Name)
				}
				for k, v := range im.Labels {
					if strings.Contains(v, reg.Host) {
						t.Errorf("record %s: label %s=%q names the mirror", im.Name, k, v)
					}
				}
			}
			assertNoLeftovers(t, rt)
		})
	}
}

// When every host fails, the status says which were tried, in order:
// at resolution (two dead mirrors and the upstream), and at the pull (the
// mirror that resolved the engine no longer has its layers, and the
// upstream is not there), on both registry implementations.
func TestProvisionSimulatedNamesEveryHostTried(t *testing.T) {
	ctx := context.Background()
	t.Run("resolve", func(t *testing.T) {
		dead := func() string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			return addr
		}
		m1, m2 := dead(), dead()
		body := mirrorOf(m1) + fmt.Sprintf("\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", m2)
		p, _ := mirrorProvisioner(t, body)
		st := p.Provision(ctx, provision.Want{Ref: upstream + "/demo:1.0"})
		if st.State != provision.Failed || st.Err == nil {
			t.Fatalf("%s", st)
		}
		for _, want := range []string{"http://" + m1 + "/v2", "http://" + m2 + "/v2", "https://" + upstream + "/v2"} {
			if !strings.Contains(st.Detail, want) || !strings.Contains(st.Err.Error(), want) {
				t.Errorf("status does not name %s:\ndetail: %s\nerr: %v", want, st.Detail, st.Err)
			}
		}
	})
	for _, reg := range testenv.Registries(t) {
		t.Run("pull/"+reg.Name, func(t *testing.T) {
			// A layer of this test's own, so containerd cannot have it from
			// another pull; the registry then loses it.
			own, err := sandbox.RandomLayer(4096)
			if err != nil {
				t.Fatal(err)
			}
			v := cu129
			v.Layers = []v1.Layer{own}
			if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{v}); err != nil {
				t.Fatal(err)
			}
			ld, err := own.Digest()
			if err != nil {
				t.Fatal(err)
			}
			testenv.DeleteBlob(t, reg.Host, "demo", ld.String())
			p, _ := mirrorProvisioner(t, mirrorOf(reg.Host))
			st := p.Provision(ctx, provision.Want{Ref: upstream + "/demo:1.0"})
			if st.State != provision.Failed || len(st.Attempts) != 1 || st.Attempts[0].Stage != "pull" {
				t.Fatalf("%s; attempts %+v", st, st.Attempts)
			}
			for _, want := range []string{"http://" + reg.Host + "/v2", "https://" + upstream + "/v2"} {
				if !strings.Contains(st.Attempts[0].Reason, want) || !strings.Contains(st.Err.Error(), want) {
					t.Errorf("the failed pull does not name %s:\nreason: %s\nerr: %v", want, st.Attempts[0].Reason, st.Err)
				}
			}
			// A caller reaches the failed pull through Status.Err, and it
			// names the upstream reference.
			var pe *provision.PullError
			if !errors.Is(st.Err, provision.ErrAllFailed) || !errors.As(st.Err, &pe) || pe.Variant != "cu129" || pe.Ref != st.Attempts[0].Ref {
				t.Fatalf("err %v; want ErrAllFailed over cu129's *PullError", st.Err)
			}
			if !strings.HasPrefix(pe.Ref, upstream+"/demo@sha256:") {
				t.Errorf("pulled ref %s: want the upstream name", pe.Ref)
			}
		})
	}
}
