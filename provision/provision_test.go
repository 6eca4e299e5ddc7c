package provision_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var (
	cu13  = testenv.CU13
	cu129 = testenv.CU129
	h100  = testenv.H100
)

type env struct {
	reg  *sandbox.Registry
	rt   *containerd.Runtime
	node *testenv.Node
	p    *provision.Provisioner
	ref  string
}

// testOptions keep a test to itself: no overrides file, a lock directory
// of its own.
func testOptions(t *testing.T, nodes node.Reader, extra ...provision.Option) []provision.Option {
	return append([]provision.Option{provision.WithNode(nodes), provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(t.TempDir()), provision.WithProbeTimeout(30 * time.Second), provision.WithProbeDir(t.TempDir())}, extra...)
}

func setup(t *testing.T, facts *node.Facts, variants []sandbox.EngineVariant, extra ...provision.Option) *env {
	t.Helper()
	e := &env{reg: testenv.Registry(t), rt: testenv.Runtime(t), node: testenv.NewNode(facts)}
	if _, err := sandbox.PublishEngine(context.Background(), e.reg.Host, "demo", "1.0", variants); err != nil {
		t.Fatal(err)
	}
	e.ref = e.reg.Host + "/demo:1.0"
	e.p = testenv.Provisioner(t, e.rt, testOptions(t, e.node, extra...)...)
	return e
}

func (e *env) childRef(t *testing.T, variant string) string {
	t.Helper()
	set, err := (&images.Resolver{}).Resolve(context.Background(), e.ref)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range set.Variants {
		if v.Variant == variant {
			return v.Ref
		}
	}
	t.Fatalf("no variant %s", variant)
	return ""
}

func TestProvisionSimulatedPicksVariantAndPinsIt(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if st.State != provision.Ready {
		t.Fatalf("state %s: %s", st.State, st.Detail)
	}
	want := e.childRef(t, "cu129")
	if st.Pinned != want || st.Variant != "cu129" || st.Key != "demo:1.0" || !st.Simulated {
		t.Fatalf("status %+v; want cu129 pinned as %s", st, want)
	}
	// The child was pulled by digest: the record is named by it.
	if _, err := e.rt.Client().ImageService().Get(testenv.Context(e.rt), want); err != nil {
		t.Fatalf("no image record %s: %v", want, err)
	}
	// The probe container's own view of its box.
	for _, line := range []string{"GPUPIN-SIM net=lo", "GPUPIN-SIM rootfs-writable=no", "GPUPIN-SIM capeff=0000000000000000", "GPUPIN-SIM nonewprivs=1"} {
		if !strings.Contains(st.ProbeOutput, line+"\n") {
			t.Errorf("probe output lacks %q:\n%s", line, st.ProbeOutput)
		}
	}
	// cu13 was rejected for the driver, with the reason.
	if len(st.Rejected) != 1 || st.Rejected[0].Variant != "cu13" || !strings.Contains(st.Rejected[0].Reason, "supports CUDA 12.9") {
		t.Errorf("rejected = %+v", st.Rejected)
	}
	img, err := e.rt.Client().ImageService().Get(testenv.Context(e.rt), want)
	if err != nil {
		t.Fatal(err)
	}
	f := h100("575.57.08", "12.9")
	for k, v := range map[string]string{
		containerd.LabelPin: "demo:1.0", containerd.LabelVariant: "cu129", containerd.LabelSource: e.ref,
		containerd.LabelNode: f.Fingerprint(), containerd.LabelCRIPinned: "pinned", containerd.LabelOverride: "auto",
		containerd.LabelSimulated: "true",
	} {
		if img.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, img.Labels[k], v)
		}
	}
	if _, err := time.Parse(time.RFC3339, img.Labels[containerd.LabelProbedAt]); err != nil {
		t.Errorf("probed-at label %q: %v", img.Labels[containerd.LabelProbedAt], err)
	}
	if !strings.Contains(img.Labels[containerd.LabelVerdict], `"ok":true`) {
		t.Errorf("verdict label %q", img.Labels[containerd.LabelVerdict])
	}
	assertNoLeftovers(t, e.rt)
}

func TestProvisionSimulatedAutoFallsBack(t *testing.T) {
	ctx := context.Background()
	bad := cu13
	bad.SimProbe = "fail"
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{bad, cu129})
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if st.State != provision.Ready || st.Variant != "cu129" {
		t.Fatalf("state %s variant %s: %s", st.State, st.Variant, st.Detail)
	}
	var f *probe.Failure
	if len(st.Attempts) != 1 || st.Attempts[0].Variant != "cu13" || st.Attempts[0].Stage != "probe" || !errors.As(st.Attempts[0].Err, &f) {
		t.Fatalf("attempts = %+v; want cu13's *probe.Failure", st.Attempts)
	}
	if !strings.Contains(st.Detail, "cu13 failed at probe") || !strings.Contains(st.Detail, "cu129") {
		t.Errorf("detail does not name both: %s", st.Detail)
	}
	// The failed candidate's record is gone; only the pin remains.
	if _, err := e.rt.Client().ImageService().Get(testenv.Context(e.rt), e.childRef(t, "cu13")); err == nil {
		t.Error("the failed cu13 candidate's image record was kept")
	}
	assertNoLeftovers(t, e.rt)
}

func TestProvisionSimulatedForcedVariantFailsWithoutPin(t *testing.T) {
	ctx := context.Background()
	bad := cu13
	bad.SimProbe = "fail"
	e := setup(t, h100("580.82.07", "13.0"), []sandbox.EngineVariant{bad, cu129})
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref, Override: "cu13"})
	if len(st.Attempts) != 1 {
		t.Fatalf("attempts %+v: %s", st.Attempts, st.Detail)
	}
	if f := probeFailure(t, st); !strings.Contains(f.Reason, "simulated failure") {
		t.Errorf("the failure lacks the probe's reason: %q", f.Reason)
	}
	pins, err := e.rt.Pins(ctx)
	if err != nil || len(pins) != 0 {
		t.Fatalf("pins = %+v, %v; want none", pins, err)
	}
}

func TestProvisionSimulatedCDIInjectionInProbe(t *testing.T) {
	ctx := context.Background()
	specDir := t.TempDir()
	os.WriteFile(filepath.Join(specDir, "nvidia.yaml"), []byte(`cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      deviceNodes:
        - path: /dev/gpupin-test0
          hostPath: /dev/null
      env:
        - GPUPIN_CDI_TEST=from-cdi
`), 0o644)
	e := &env{reg: testenv.Registry(t), rt: testenv.Runtime(t, containerd.WithCDISpecDirs(specDir)), node: testenv.NewNode(h100("580.82.07", "13.0"))}
	if _, err := sandbox.PublishEngine(ctx, e.reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu13}); err != nil {
		t.Fatal(err)
	}
	gpus := containerd.GPUs{Mode: containerd.GPUCDI, Devices: []string{containerd.DefaultCDIDevice}}
	e.p = testenv.Provisioner(t, e.rt, testOptions(t, e.node, provision.WithGPUs(gpus))...)
	st := e.p.Provision(ctx, provision.Want{Ref: e.reg.Host + "/demo:1.0"})
	if st.State != provision.Ready {
		t.Fatalf("%s: %s", st.State, st.Detail)
	}
	for _, line := range []string{"GPUPIN-SIM env=from-cdi\n", "GPUPIN-SIM devices=/dev/gpupin-test0\n"} {
		if !strings.Contains(st.ProbeOutput, line) {
			t.Errorf("probe did not see %q:\n%s", line, st.ProbeOutput)
		}
	}
}

func TestProvisionSimulatedProbeTimeoutLeavesNothing(t *testing.T) {
	ctx := context.Background()
	hang := cu129
	hang.SimProbe = "hang"
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{hang}, provision.WithProbeTimeout(2*time.Second))
	start := time.Now()
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if f := probeFailure(t, st); f.Reason != "sim probe did not finish in 2s and was killed" {
		t.Fatalf("reason %q", f.Reason)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("a 2s timeout took %s", d)
	}
	assertNoLeftovers(t, e.rt)
}

func TestProvisionSimulatedBadVerdicts(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{
		{"garbled", "verdict"},
		{"noline", `no "GPUPIN-PROBE" line`},
		{"exit1", "exit"},
		{"big", ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			v := cu129
			v.SimProbe = tc.mode
			e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{v})
			st := e.p.Provision(context.Background(), provision.Want{Ref: e.ref})
			if tc.mode == "big" {
				// A flood of output before a good line: capped, and still read.
				if st.State != provision.Ready {
					t.Fatalf("%s: %s", st.State, st.Detail)
				}
				return
			}
			if f := probeFailure(t, st); !strings.Contains(strings.ToLower(f.Reason), strings.ToLower(tc.want)) {
				t.Errorf("reason %q lacks %q", f.Reason, tc.want)
			}
			pins, _ := e.rt.Pins(context.Background())
			if len(pins) != 0 {
				t.Errorf("pinned after a bad verdict: %+v", pins)
			}
		})
	}
}

func TestReprovisionSimulatedFailureKeepsPinAndSameNodeNeedsNoRegistry(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	first := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if first.State != provision.Ready {
		t.Fatalf("%s: %s", first.State, first.Detail)
	}

	// Same node: answered by the pin, no registry request at all.
	e.reg.Reset()
	again := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if again.State != provision.Ready || !again.FromPin || again.Pinned != first.Pinned {
		t.Fatalf("re-provision: %+v", again)
	}
	if reqs := e.reg.Requests(); len(reqs) != 0 {
		t.Fatalf("re-provision on the same node made %d registry requests: %v", len(reqs), reqs)
	}
	// Even with the registry down.
	e.reg.SetDown(true)
	if st := e.p.Provision(ctx, provision.Want{Ref: e.ref}); st.State != provision.Ready {
		t.Fatalf("registry down, already provisioned: %s: %s", st.State, st.Detail)
	}
	e.reg.SetDown(false)

	// The tag moves to builds whose probes fail, and the driver is
	// upgraded: the re-provision fails and the old pin stays as it was.
	bad13, bad129 := cu13, cu129
	bad13.SimProbe, bad129.SimProbe = "fail", "fail"
	bad129.Env = []string{"REBUILT=1"} // a new digest
	if _, err := sandbox.PublishEngine(ctx, e.reg.Host, "demo", "1.0", []sandbox.EngineVariant{bad13, bad129}); err != nil {
		t.Fatal(err)
	}
	before, _ := e.rt.GetPin(ctx, "demo:1.0")
	e.node.Set(h100("580.82.07", "13.0"))
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	// The detail tells the operator the earlier pin stands.
	if probeFailure(t, st); len(st.Attempts) != 2 || !strings.Contains(st.Detail, "the earlier pin "+first.Pinned+" (cu129) is unchanged") {
		t.Fatalf("attempts %d: %s", len(st.Attempts), st.Detail)
	}
	after, _ := e.rt.GetPin(ctx, "demo:1.0")
	if after == nil || *after != *before {
		t.Fatalf("pin changed by a failed provision:\nbefore %+v\nafter  %+v", before, after)
	}
}

func TestProvisionSimulatedConcurrentSameEngineOnePull(t *testing.T) {
	ctx := context.Background()
	// A layer of its own: the daemon shares content across namespaces, so a
	// layer another test pulled would not be fetched at all.
	layer, err := sandbox.RandomLayer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	ld, _ := layer.Digest()
	v := cu129
	v.Layers = []v1.Layer{layer}
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{v})
	e.reg.Reset()
	var wg sync.WaitGroup
	sts := make([]provision.Status, 4)
	for i := range sts {
		wg.Add(1)
		go func() { defer wg.Done(); sts[i] = e.p.Provision(ctx, provision.Want{Ref: e.ref}) }()
	}
	wg.Wait()
	for i, st := range sts {
		if st.State != provision.Ready || st.Pinned != sts[0].Pinned {
			t.Fatalf("provision %d: %s %s", i, st.State, st.Detail)
		}
	}
	n := 0
	for _, r := range e.reg.Requests() {
		if r.Method == "GET" && strings.HasSuffix(r.Path, "/blobs/"+ld.String()) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the layer was fetched %d times by 4 concurrent provisions; want one pull", n)
	}
}

func assertNoLeftovers(t *testing.T, rt *containerd.Runtime) {
	t.Helper()
	ctx := testenv.Context(rt)
	conts, err := rt.Client().Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(conts) != 0 {
		t.Errorf("%d containers left", len(conts))
	}
	imgs, _ := rt.Client().ImageService().List(ctx)
	// A pin's lease and its node-local name belong to the pin.
	pinned := map[string]string{} // key -> digest
	for _, img := range imgs {
		if k := img.Labels[containerd.LabelPin]; k != "" {
			pinned[k] = img.Target.Digest.String()
		}
	}
	ls, err := rt.Client().LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Labels[containerd.LabelRole] != containerd.PinLeaseRole || pinned[l.Labels[containerd.LabelPin]] == "" {
			t.Errorf("lease left: %s %v", l.ID, l.Labels)
		}
	}
	for _, img := range imgs {
		if k := img.Labels[containerd.LabelLocal]; k != "" && pinned[k] == img.Target.Digest.String() {
			continue
		}
		if img.Labels[containerd.LabelPin] == "" {
			t.Errorf("unpinned image record left: %s %v", img.Name, img.Labels)
		}
	}
	_ = fmt.Sprint()
}

func TestProvisionSimulatedFailedOverrideKeepsServingEarlierPin(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu13, cu129})
	first := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	if first.State != provision.Ready {
		t.Fatalf("%s: %s", first.State, first.Detail)
	}
	// Forcing cu13 on a CUDA 12.9 driver: it is still probed (and the
	// simulated probe fails it as the real one would), with no fallback.
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref, Override: "cu13"})
	if st.State != provision.Failed || len(st.Attempts) != 1 || st.Attempts[0].Variant != "cu13" {
		t.Fatalf("state %s attempts %+v: %s", st.State, st.Attempts, st.Detail)
	}
	if f := probeFailure(t, st); !strings.Contains(f.Reason, "CUDA driver version is insufficient") {
		t.Errorf("the failure lacks the probe's reason: %q", f.Reason)
	}
	// The earlier pin still holds on this node: the status says where replicas start from.
	if st.Pinned != first.Pinned {
		t.Fatalf("failed status pinned %q, want the earlier pin %q", st.Pinned, first.Pinned)
	}
	// What was attempted and what is pinned are told apart, in the
	// fields, the JSON and the one-line form.
	if st.Variant != "cu129" || st.Attempted != "cu13" || st.Pin == nil || st.Pin.Variant != "cu129" {
		t.Fatalf("variant %q, attempted %q, pin %+v; want variant cu129 (the pin's), attempted cu13", st.Variant, st.Attempted, st.Pin)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil || m["variant"] != "cu129" || m["attempted"] != "cu13" || m["pinned"] != first.Pinned {
		t.Fatalf("JSON: variant %v, attempted %v, pinned %v; want cu129, cu13, %s", m["variant"], m["attempted"], m["pinned"], first.Pinned)
	}
	if got := st.String(); !strings.HasPrefix(got, "demo:1.0: failed (cu13 tried; cu129 still pinned): ") {
		t.Fatalf("String() = %q", got)
	}
	pin, _ := e.rt.GetPin(ctx, "demo:1.0")
	if pin == nil || pin.Ref != first.Pinned || pin.Variant != "cu129" {
		t.Fatalf("pin after the failed override: %+v", pin)
	}
}

func TestProvisionSimulatedTwoProcessesOneEngineWait(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu129})
	lockDir := t.TempDir()
	// Another process holds the engine's lock: this provision waits for it.
	release, err := provision.LockKeyForTest(ctx, lockDir, testenv.Namespace(t)+"\x00demo:1.0")
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.Provisioner(t, e.rt, testOptions(t, e.node, provision.WithLockDir(lockDir))...)
	done := make(chan provision.Status, 1)
	go func() { done <- p.Provision(ctx, provision.Want{Ref: e.ref}) }()
	select {
	case st := <-done:
		t.Fatalf("provisioned while another process held the lock: %s", st.State)
	case <-time.After(500 * time.Millisecond):
	}
	release()
	if st := <-done; st.State != provision.Ready {
		t.Fatalf("%s: %s", st.State, st.Detail)
	}
	// A cancelled wait says what it waited for (under another override, so
	// the pin just made does not answer).
	release, _ = provision.LockKeyForTest(ctx, lockDir, testenv.Namespace(t)+"\x00demo:1.0")
	defer release()
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	st := p.Provision(cctx, provision.Want{Ref: e.ref, Override: "cu129"})
	if st.State != provision.Failed || !errors.Is(st.Err, context.DeadlineExceeded) || !strings.Contains(st.Detail, "another gpupin") {
		t.Fatalf("%s (err %v)", st, st.Err)
	}
}

// A simulated probe never stands for a proof on hardware: it does not
// replace a pin proved on a GPU, and a simulated pin does not answer for a
// real node with the same facts.
func TestProvisionSimulatedNeverReplacesHardwarePin(t *testing.T) {
	ctx := context.Background()
	e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu129})
	child := e.childRef(t, "cu129")
	if _, err := e.rt.Pull(ctx, child, containerd.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	real := *h100("575.57.08", "12.9")
	real.Simulated = false
	hw := containerd.Pin{Key: "demo:1.0", Ref: child, Variant: "cu129", Source: e.ref, Override: "auto",
		Node: real.Fingerprint(), ProbedAt: time.Now().Add(-time.Hour).Truncate(time.Second), Probe: "cuda", Verdict: `{"ok":true}`}
	if err := e.rt.SetPin(ctx, hw, containerd.SetPinOptions{}); err != nil {
		t.Fatal(err)
	}
	// Same driver and GPUs, but simulated: the hardware pin does not count
	// as proved here, and the simulated probe may not replace it.
	st := e.p.Provision(ctx, provision.Want{Ref: e.ref})
	// It is refused before any pull: no attempt was made.
	// A conflict, and not with another source: the words say which.
	if st.State != provision.Failed || len(st.Attempts) != 0 || !errors.Is(st.Err, provision.ErrConflict) || !strings.Contains(st.Detail, "proved on hardware") {
		t.Fatalf("state %s attempts %+v (err %v): %s", st.State, st.Attempts, st.Err, st.Detail)
	}
	after, _ := e.rt.GetPin(ctx, "demo:1.0")
	if after == nil || after.Simulated || !after.ProbedAt.Equal(hw.ProbedAt) || after.Node != hw.Node {
		t.Fatalf("the hardware pin changed: %+v", after)
	}
	// And the reverse (a namespace of its own): the real node does not take
	// a simulated pin as proved.
	t.Run("reverse", func(t *testing.T) {
		e2 := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{cu129})
		if st := e2.p.Provision(ctx, provision.Want{Ref: e2.ref}); st.State != provision.Ready {
			t.Fatalf("%s: %s", st.State, st.Detail)
		}
		realNode := testenv.Provisioner(t, e2.rt, testOptions(t, node.Static{Facts: &real})...)
		e2.reg.SetDown(true) // were the simulated pin trusted, no registry would be needed
		if st := realNode.Provision(ctx, provision.Want{Ref: e2.ref}); st.FromPin || st.State == provision.Ready {
			t.Fatalf("a real node took a simulated pin as proved: %s %s", st.State, st.Detail)
		}
	})
}

// The fast tier: the order of attempts and fallback, on memrt.Runtime.
func TestProvisionFallbackOrderSimulated(t *testing.T) {
	set := memrt.EngineSet(demoRef, "demo", "1.0")
	cu13Ref, cu129Ref := set.Variants[0].Ref, set.Variants[1].Ref
	failing := memrt.VerdictLine(probe.Verdict{OK: false, Devices: []probe.Device{}, Detail: "gemm mismatch"})
	for _, tc := range []struct {
		name     string
		override string
		pullErr  map[string]error
		output   map[string]string
		state    provision.State
		variant  string
		attempts []string // variant/stage, in order
		pulls    []string
	}{
		{"the first passes", "", nil, nil, provision.Ready, "cu13", nil, []string{cu13Ref}},
		{"a pull fails: the next", "", map[string]error{cu13Ref: errors.New("connection reset")}, nil, provision.Ready, "cu129", []string{"cu13/pull"}, []string{cu13Ref, cu129Ref}},
		{"a probe fails: the next", "", nil, map[string]string{cu13Ref: failing}, provision.Ready, "cu129", []string{"cu13/probe"}, []string{cu13Ref, cu129Ref}},
		{"garbled output: the next", "", nil, map[string]string{cu13Ref: probe.LinePrefix + "{\"ok\":tru"}, provision.Ready, "cu129", []string{"cu13/probe"}, []string{cu13Ref, cu129Ref}},
		{"all fail", "", nil, map[string]string{cu13Ref: failing, cu129Ref: failing}, provision.Failed, "", []string{"cu13/probe", "cu129/probe"}, []string{cu13Ref, cu129Ref}},
		{"a forced variant does not fall back", "cu13", nil, map[string]string{cu13Ref: failing}, provision.Failed, "", []string{"cu13/probe"}, []string{cu13Ref}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := memrt.New()
			for ref, err := range tc.pullErr {
				m.FailPull(ref, err)
			}
			for ref, out := range tc.output {
				m.SetProbe(ref, out, 0)
			}
			p := memProvisioner(t, m, memrt.Resolver{demoRef: set}, h100("580.82.07", "13.0"))
			st := p.Provision(t.Context(), provision.Want{Ref: demoRef, Override: tc.override})
			var attempts []string
			for _, a := range st.Attempts {
				attempts = append(attempts, a.Variant+"/"+a.Stage)
			}
			if st.State != tc.state || st.Variant != tc.variant || !slices.Equal(attempts, tc.attempts) || !slices.Equal(m.Pulled(), tc.pulls) {
				t.Fatalf("%s, variant %q, attempts %v, pulls %v; want %s, %q, %v, %v", st, st.Variant, attempts, m.Pulled(), tc.state, tc.variant, tc.attempts, tc.pulls)
			}
			pins, _ := m.ListPins(t.Context())
			if tc.state == provision.Ready && (len(pins) != 1 || pins[0].Variant != tc.variant || pins[0].Key != "demo:1.0") {
				t.Fatalf("pins %+v, want one of demo:1.0 on %s", pins, tc.variant)
			}
			if tc.state == provision.Failed && (len(pins) != 0 || !errors.Is(st.Err, provision.ErrAllFailed)) {
				t.Fatalf("pins %+v, err %v; want none, ErrAllFailed", pins, st.Err)
			}
		})
	}
}

// A failed provision never changes a working pin: the earlier one stays,
// and the status names it.
func TestProvisionFailureKeepsTheEarlierPinSimulated(t *testing.T) {
	set := memrt.EngineSet(demoRef, "demo", "1.0")
	facts := h100("580.82.07", "13.0")
	m := memrt.New()
	p := memProvisioner(t, m, memrt.Resolver{demoRef: set}, facts)
	if st := p.Provision(t.Context(), provision.Want{Ref: demoRef}); st.State != provision.Ready {
		t.Fatal(st)
	}
	before, _ := m.ListPins(t.Context())
	failing := memrt.VerdictLine(probe.Verdict{OK: false, Devices: []probe.Device{}})
	m.SetProbe(set.Variants[1].Ref, failing, 0)
	st := p.Provision(t.Context(), provision.Want{Ref: demoRef, Override: "cu129"})
	after, _ := m.ListPins(t.Context())
	if st.State != provision.Failed || !slices.Equal(before, after) {
		t.Fatalf("%s; pins %+v, were %+v", st, after, before)
	}
	if !strings.Contains(st.Detail, "the earlier pin "+before[0].Ref+" (cu13) is unchanged") {
		t.Fatalf("detail %q does not name the earlier pin", st.Detail)
	}
}

// New refuses what would fail later: a nil *containerd.Runtime, and an
// option's bad value.
func TestNewRefuses(t *testing.T) {
	var nilRuntime *containerd.Runtime
	for _, tc := range []struct {
		name string
		rt   provision.Runtime
		opt  provision.Option
		want string
	}{
		{"a nil *containerd.Runtime", nilRuntime, nil, "nil *containerd.Runtime"},
		{"a negative timeout", nil, provision.WithTimeout(-time.Second), "WithTimeout(-1s)"},
		{"a negative probe timeout", nil, provision.WithProbeTimeout(-time.Second), "WithProbeTimeout(-1s)"},
		{"negative pids", nil, provision.WithProbeLimits(0, -1), "pids -1"},
		{"an unknown probe", nil, provision.WithDefaultProbe("bogus"), `WithDefaultProbe("bogus")`},
		{"a negative prefetch", nil, provision.WithPrefetch(-1), "WithPrefetch(-1)"},
		{"no lock directory", nil, provision.WithLockDir(""), "WithLockDir"},
		{"a nil node", nil, provision.WithNode(nil), "WithNode(nil)"},
		{"nil overrides", nil, provision.WithOverrides(nil), "NoOverrides()"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := provision.New(tc.rt, tc.opt)
			if err == nil || p != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, %v; want an error saying %q", p, err, tc.want)
			}
		})
	}
	// Without containerd (nil), Plan reads no pins and the rest say so.
	p, err := provision.New(nil, provision.WithNode(node.Static{Facts: h100("580.82.07", "13.0")}),
		provision.WithResolver(memrt.Resolver{demoRef: memrt.EngineSet(demoRef, "demo", "1.0")}), provision.WithOverrides(provision.NoOverrides()))
	if err != nil {
		t.Fatal(err)
	}
	if pl, err := p.Plan(t.Context(), provision.Want{Ref: demoRef}); err != nil || len(pl.Candidates) != 2 {
		t.Fatalf("Plan without containerd: %v, %v", pl, err)
	}
	if _, err := p.Pins(t.Context(), false); err == nil || !strings.Contains(err.Error(), "no runtime") {
		t.Fatalf("Pins without containerd: %v", err)
	}
	// A probe target needs the image as containerd holds it: without
	// containerd that is the answer, before a node that cannot be read.
	p, err = provision.New(nil, provision.WithNode(unreadable{}), provision.WithOverrides(provision.NoOverrides()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ProbeTarget(t.Context(), demoRef, provision.ProbeAs{}); err == nil || !strings.Contains(err.Error(), "no runtime") {
		t.Fatalf("ProbeTarget without containerd: %v; want it to say there is no runtime", err)
	}
}

// unreadable is a node whose facts cannot be read (NVML missing, say).
type unreadable struct{}

func (unreadable) Read(context.Context) (*node.Facts, error) {
	return nil, errors.New("nvml: library not found")
}
