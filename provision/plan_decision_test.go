package provision_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// pushEngine publishes variants under ref (host/repo:tag) with metadata
// naming engine:version, which need not be the repository's name; bare
// publishes no annotations (an upstream image: metadata derived).
func pushEngine(t *testing.T, ref, engine, version string, bare bool, vs ...sandbox.EngineVariant) {
	t.Helper()
	var published []sandbox.Variant
	for _, v := range vs {
		env := append([]string{"CUDA_VERSION=" + v.CUDA + ".0", "TORCH_CUDA_ARCH_LIST=" + v.Archs}, v.Env...)
		mode := v.SimProbe
		if mode == "" {
			mode = "emulate"
		}
		env = append(env, "GPUPIN_SIM_PROBE="+mode)
		img, err := sandbox.Image(sandbox.ImageSpec{Env: env, Cmd: []string{"/bin/sh", "-c", "echo " + ref + " " + v.Name}})
		if err != nil {
			t.Fatal(err)
		}
		published = append(published, sandbox.Variant{Image: img, Bare: bare,
			Meta: images.Metadata{Engine: engine, EngineVersion: version, Variant: v.Name, CUDA: v.CUDA, Archs: v.Archs, Probe: "cuda"}})
	}
	sandbox.Publish(t, ref, published...)
}

// The decision is made once: for every want × overrides file × node, the
// candidates Plan lists are exactly those Provision tries, in the same
// order, under the same key and override, and every other outcome is the
// same on both sides. Every probe fails, so Provision tries them all.
func TestSimulatedPlanIsWhatProvisionTries(t *testing.T) {
	ctx := context.Background()
	// On both registries (go-containerregistry's and Debian's
	// docker-registry): the decision must not depend on which serves it.
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			rt := testenv.Runtime(t)
			fail13, fail129 := cu13, cu129
			fail13.SimProbe, fail129.SimProbe = "fail", "fail"
			annotated := reg.Host + "/demo:1.0"
			pushEngine(t, annotated, "demo", "1.0", false, fail13, fail129)
			// Named vllm by its metadata, vllm-openai by its repository.
			renamed := reg.Host + "/vllm/vllm-openai:0.11.0"
			pushEngine(t, renamed, "vllm", "0.11.0", false, fail13, fail129)
			upstream := reg.Host + "/up/vllm-openai:0.11.0"
			pushEngine(t, upstream, "", "", true, fail13, fail129)

			v100 := &node.Facts{Driver: "580.82.07", CUDA: "13.0", Platform: "linux/amd64", Simulated: true,
				GPUs: []node.GPU{{Index: 0, UUID: "GPU-v100", Name: "Tesla V100-SXM2-32GB", Brand: "tesla", CC: "7.0"}}}
			nodes := map[string]*node.Facts{
				"h100-580": h100("580.82.07", "13.0"),
				"h100-575": h100("575.57.08", "12.9"),
				"v100-580": v100,
				"no-driver": {Platform: "linux/amd64", Simulated: true, GPUs: []node.GPU{},
					Unsupported: "no NVIDIA driver (simulated)"},
			}
			files := map[string]string{
				"none":              "",
				"vllm-openai=none":  "overrides:\n  vllm-openai: none\n",
				"vllm=cu129":        "overrides:\n  vllm: cu129\n",
				"demo=none":         "overrides:\n  demo: none\n",
				"demo=image":        "overrides:\n  demo: " + upstream + "\n",
				"vllm=unpublished":  "overrides:\n  vllm: cu999\n",
				"vllm-openai=cu129": "overrides:\n  vllm-openai: cu129\n",
			}
			wants := []provision.Want{
				{Ref: annotated}, {Ref: renamed}, {Ref: upstream},
				{Ref: annotated, Override: "cu13"},
			}
			dir := t.TempDir()
			for fname, body := range files {
				path := filepath.Join(dir, fname+".yaml")
				if body != "" {
					if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				for nname, facts := range nodes {
					for _, w := range wants {
						name := fmt.Sprintf("%s/%s/%s%s", fname, nname, strings.TrimPrefix(w.Ref, reg.Host+"/"), w.Override)
						t.Run(name, func(t *testing.T) {
							p := testenv.Provisioner(t, rt, testOptions(t, node.Static{Facts: facts}, provision.WithOverrides(provision.OverridesFromFile(path)))...)
							pl, err := p.Plan(ctx, w)
							if err != nil {
								t.Fatal(err)
							}
							st := p.Provision(ctx, w)
							compareDecision(t, pl, st)
						})
					}
				}
			}
		})
	}
}

func compareDecision(t *testing.T, pl *provision.Plan, st provision.Status) {
	t.Helper()
	if pl.Outcome != images.OutcomeUnsupported && (st.Key != pl.Key || st.Override != pl.Override) {
		t.Errorf("provision ran as %s under %s; plan said %s under %s", st.Key, st.Override, pl.Key, pl.Override)
	}
	switch pl.Outcome {
	case images.OutcomeReady:
		var planned, tried []string
		for _, c := range pl.Candidates {
			planned = append(planned, c.Ref)
		}
		for _, a := range st.Attempts {
			tried = append(tried, a.Ref)
		}
		if fmt.Sprint(planned) != fmt.Sprint(tried) || st.State != provision.Failed {
			t.Errorf("plan listed %v; provision (%s) tried %v", planned, st.State, tried)
		}
	case images.OutcomeNone:
		if st.State != provision.Disabled || !errors.Is(st.Err, provision.ErrDisabled) {
			t.Errorf("plan says none; provision %s", st)
		}
	case images.OutcomeUnsupported:
		if st.State != provision.Unsupported || !errors.Is(st.Err, provision.ErrUnsupported) {
			t.Errorf("plan says unsupported; provision %s", st)
		}
	case images.OutcomeNoCandidate:
		if st.State != provision.Failed || len(st.Attempts) != 0 || !errors.Is(st.Err, provision.ErrNoCandidate) {
			t.Errorf("plan says no candidate; provision %s (attempts %v)", st, st.Attempts)
		}
	default:
		t.Errorf("unexpected plan outcome %s", pl.Outcome)
	}
	t.Logf("%s: %s", pl.Outcome, st)
}

// The cases the issue saw, spelled out: an override filed under the
// repository's name does not apply to an engine its metadata names
// otherwise, in plan and provision alike.
func TestSimulatedOverrideFollowsTheEngineName(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	rt := testenv.Runtime(t)
	renamed := reg.Host + "/vllm/vllm-openai:0.11.0"
	pushEngine(t, renamed, "vllm", "0.11.0", false, cu129)
	path := filepath.Join(t.TempDir(), "overrides.yaml")
	for _, tc := range []struct {
		file  string
		state provision.State
	}{
		{"overrides:\n  vllm-openai: none\n", provision.Ready},
		{"overrides:\n  vllm: none\n", provision.Disabled},
	} {
		if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		p := testenv.Provisioner(t, rt, testOptions(t, node.Static{Facts: h100("580.82.07", "13.0")}, provision.WithOverrides(provision.OverridesFromFile(path)))...)
		pl, err := p.Plan(ctx, provision.Want{Ref: renamed})
		if err != nil {
			t.Fatal(err)
		}
		st := p.Provision(ctx, provision.Want{Ref: renamed})
		if st.State != tc.state || pl.Engine != "vllm" || st.Engine != "vllm" {
			t.Fatalf("%q: plan %s (engine %s), provision %s; want %s", tc.file, pl.Outcome, pl.Engine, st, tc.state)
		}
	}
}
