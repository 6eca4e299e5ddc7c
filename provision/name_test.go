package provision_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

// ProbeTarget reads an image in containerd as a provision reads it: the
// engine Plan names, the probe Plan says each candidate gets, and for a
// pin the metadata of the entry it was chosen from. When the registry is
// down the image's own config stands in, and the target says so.
func TestSimulatedProbeTargetIsWhatProvisionProbes(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	facts := h100("580.82.07", "13.0")
	p := testenv.Provisioner(t, rt, testOptions(t, node.Static{Facts: facts})...)

	// An upstream image: no labels, no annotations, a repository named vllm-openai.
	bare, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1", "GPUPIN_SIM_PROBE=emulate"}})
	if err != nil {
		t.Fatal(err)
	}
	upstream := reg.Host + "/vllm/vllm-openai:v0.11.0"
	if _, err := sandbox.PushImage(ctx, upstream, bare); err != nil {
		t.Fatal(err)
	}
	// A published one whose index entry alone names its probe: the image's
	// own self-test (exec), which passes on a simulated node.
	selftest, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1", "SELFTEST_OK=true"}})
	if err != nil {
		t.Fatal(err)
	}
	argv, _ := json.Marshal([]string{"/bin/sh", "-c", selfTest})
	meta := images.Metadata{Engine: "eng", EngineVersion: "1.0", Variant: "cu129", CUDA: "12.9", Probe: "exec", ProbeExec: string(argv)}
	published := sandbox.Publish(t, reg.Host+"/eng:1.0", sandbox.Variant{Image: selftest, Meta: meta})
	// Pinned as provision pins it, by its self-test.
	st := p.Provision(ctx, provision.Want{Ref: published})
	if st.State != provision.Ready {
		t.Fatalf("provision of %s: %s", published, st)
	}
	pin, err := rt.GetPin(ctx, "eng:1.0")
	if err != nil || pin == nil {
		t.Fatalf("pin: %+v, %v", pin, err)
	}
	pulledUp, err := rt.Pull(ctx, upstream, containerd.PullOptions{Platform: facts.Platform})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := p.Plan(ctx, provision.Want{Ref: upstream})
	if err != nil || len(pl.Candidates) != 1 {
		t.Fatalf("plan of %s: %+v, %v", upstream, pl, err)
	}

	for _, tc := range []struct {
		name    string
		image   string
		as      provision.ProbeAs
		down    bool
		engine  string
		namedBy string
		kind    probe.Kind
		from    string
	}{
		{"upstream, as plan names it", pulledUp.Name, provision.ProbeAs{}, false, pl.Engine, pl.NamedBy, probe.Kind(pl.Candidates[0].Probe), "the registry: " + pulledUp.Name},
		{"a pin: its source's index entry", pin.Ref, provision.ProbeAs{}, false, "eng", provision.NamedByPin, probe.Exec, "the registry: " + published + ", the source of pin eng:1.0"},
		{"a pin by its local name", pin.Local, provision.ProbeAs{}, false, "eng", provision.NamedByPin, probe.Exec, "the registry: " + published},
		{"the caller names engine and probe", pin.Ref, provision.ProbeAs{Engine: "other", Probe: "cuda"}, false, "other", provision.NamedByWant, probe.CUDA, "the registry: " + published},
		{"registry down: the upstream image's config", pulledUp.Name, provision.ProbeAs{}, true, "vllm-openai", provision.NamedByReference, probe.Torch,
			"the image's own config in containerd (the registry did not answer: "},
		{"registry down: a pin keeps its key and the probe that proved it", pin.Ref, provision.ProbeAs{}, true, "eng", provision.NamedByPin, probe.Exec,
			"the image's own config in containerd (the registry did not answer: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.SetDown(tc.down)
			defer reg.SetDown(false)
			got, err := p.ProbeTarget(ctx, tc.image, tc.as)
			if err != nil {
				t.Fatal(err)
			}
			if got.Engine != tc.engine || got.NamedBy != tc.namedBy || got.Probe != tc.kind || !strings.HasPrefix(got.From, tc.from) {
				t.Fatalf("target %+v\nwant engine %s named by %s, probe %s, from %q…", got, tc.engine, tc.namedBy, tc.kind, tc.from)
			}
			if got.Node == nil || got.Node.Fingerprint() != facts.Fingerprint() {
				t.Errorf("target node %+v", got.Node)
			}
		})
	}

	// Refusals, each of its class.
	noDriver := testenv.Provisioner(t, rt, testOptions(t, node.Static{Facts: &node.Facts{Platform: "linux/amd64", Unsupported: "no NVIDIA driver"}})...)
	for _, tc := range []struct {
		name  string
		p     *provision.Provisioner
		image string
		as    provision.ProbeAs
		class error
	}{
		{"not pulled", p, reg.Host + "/never:1", provision.ProbeAs{}, provision.ErrNotPulled},
		{"not a reference", p, "UPPER/Case::x", provision.ProbeAs{}, provision.ErrInvalidWant},
		{"an unknown probe", p, pin.Ref, provision.ProbeAs{Probe: "gpu"}, provision.ErrInvalidWant},
		{"an unsupported node", noDriver, pin.Ref, provision.ProbeAs{}, provision.ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.p.ProbeTarget(ctx, tc.image, tc.as)
			if !errors.Is(err, tc.class) {
				t.Fatalf("ProbeTarget = %+v, %v; want %v", got, err, tc.class)
			}
		})
	}
}
