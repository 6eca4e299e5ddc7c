package agent_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

var _ agent.RunRuntime = (*memrt.Runtime)(nil)

// Run over the in-memory runtime, no daemon: the want from RunConfig is
// proved (cu129 on driver 575), the periodic pass sweeps and restores, and
// GET /v1/pins lists the pin.
func TestRunOverAnInMemoryRuntime(t *testing.T) {
	const ref = "reg.example/org/demo:1.0"
	m := memrt.New()
	opts := append([]provision.Option{provision.WithNode(node.Static{Facts: h100("575.57.08", "12.9")}),
		provision.WithResolver(memrt.Resolver{ref: memrt.EngineSet(ref, "demo", "1.0")})}, memrt.Staged(t)...)
	r := startRun(t, agent.RunConfig{Runtime: m, Provision: opts,
		Options: agent.Options{NoOverridesFile: true, SweepEvery: 20 * time.Millisecond},
		Wants:   []provision.Want{{Ref: ref}}})
	r.waitFor(t, 10*time.Second, "ready", one(provision.Ready, "cu129"))
	waitUntil(t, 5*time.Second, "a periodic pass", func() bool { s, rc := m.Passes(); return s > 0 && rc > 0 })
	code, _, body := do(t, r.agent.Handler(), "GET", "/v1/pins", "")
	if code != 200 || !bytes.Contains(body, []byte(`"variant": "cu129"`)) {
		t.Fatalf("GET /v1/pins: %d %s", code, body)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
