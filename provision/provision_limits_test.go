package provision_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
)

// The probe's limits reach its cgroup: the defaults (16 GiB, swap no
// further, 4096 pids), and what WithProbeLimits (--probe-memory,
// --probe-pids) sets instead.
func TestProvisionSimulatedProbeLimitsReachTheCgroup(t *testing.T) {
	hang := cu129
	hang.SimProbe = "hang"
	for _, tc := range []struct {
		name      string
		opts      []provision.Option
		mem, pids int64
	}{
		{"defaults", nil, provision.DefaultProbeMemory, provision.DefaultProbePids},
		{"WithProbeLimits", []provision.Option{provision.WithProbeLimits(96<<20, 50)}, 96 << 20, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{hang}, tc.opts...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan provision.Status, 1)
			go func() { done <- e.p.Provision(ctx, provision.Want{Ref: e.ref}) }()
			limits, err := testenv.ProbeCgroup(e.rt, 60*time.Second, func() bool { return len(done) > 0 })
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			<-done
			if got, want := strings.Join(limits, " "), strings.Join(testenv.LimitLines(tc.mem, tc.pids), " "); got != want {
				t.Fatalf("probe cgroup: %s; want %s", got, want)
			}
			assertNoLeftovers(t, e.rt)
		})
	}
}

// The overall provision timeout ends a provision stuck anywhere, and the
// status says it was that timeout: a probe that hangs (its own timeout
// far off), a registry that never answers (its header timeout far off).
func TestProvisionSimulatedProvisionTimeoutSaysSo(t *testing.T) {
	hang := cu129
	hang.SimProbe = "hang"
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) *env
	}{
		{"probe hangs", func(t *testing.T) *env {
			return setup(t, h100("575.57.08", "12.9"), []sandbox.EngineVariant{hang},
				provision.WithProbeTimeout(10*time.Minute), provision.WithTimeout(3*time.Second))
		}},
		{"registry never answers", func(t *testing.T) *env {
			reg := testenv.Registry(t)
			if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
				t.Fatal(err)
			}
			reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
				<-r.Context().Done()
				return true
			})
			rt := testenv.Runtime(t, containerd.WithRegistry(registry.New(registry.Config{HeaderTimeout: 10 * time.Minute})))
			n := testenv.NewNode(h100("575.57.08", "12.9"))
			return &env{reg: reg, rt: rt, node: n, ref: reg.Host + "/demo:1.0",
				p: testenv.Provisioner(t, rt, testOptions(t, n, provision.WithTimeout(3*time.Second))...)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.setup(t)
			start := time.Now()
			st := e.p.Provision(context.Background(), provision.Want{Ref: e.ref})
			if st.State != provision.Failed || !strings.Contains(st.Detail, "provision took longer than 3s (provision timeout)") {
				t.Fatalf("%s; want a failure that names the provision timeout", st)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("a 3s provision timeout took %s", d)
			}
			assertNoLeftovers(t, e.rt)
		})
	}
}
