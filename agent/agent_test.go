package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var (
	cu13  = testenv.CU13
	cu129 = testenv.CU129
	h100  = testenv.H100
)

type world struct {
	reg       *sandbox.Registry
	rt        *containerd.Runtime
	ref       string
	agent     *agent.Agent
	metrics   *agent.Metrics
	config    string
	overrides string
}

// newWorld runs an agent's loop over a simulated node on the test's
// containerd and registry, with its files in a temporary directory.
func newWorld(t *testing.T, config string) *world {
	t.Helper()
	return newWorldWith(t, config, provision.LoopOptions{})
}

// newWorldWith is newWorld with the loop's timings of the test's choosing.
func newWorldWith(t *testing.T, config string, lo provision.LoopOptions) *world {
	t.Helper()
	w := &world{reg: testenv.Registry(t), rt: testenv.Runtime(t)}
	if _, err := sandbox.PublishEngine(context.Background(), w.reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu13, cu129}); err != nil {
		t.Fatal(err)
	}
	w.ref = w.reg.Host + "/demo:1.0"
	dir := t.TempDir()
	w.config = filepath.Join(dir, "etc", "agent.yaml")
	w.overrides = filepath.Join(dir, "etc", "overrides.yaml")
	if config != "" {
		os.MkdirAll(filepath.Dir(w.config), 0o755)
		if err := os.WriteFile(w.config, []byte(strings.ReplaceAll(config, "REF", w.ref)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var loop *provision.Loop
	w.metrics = agent.NewMetrics(func() []provision.Status { return loop.Status() }, nil)
	p := testenv.Provisioner(t, w.rt, provision.WithNode(node.Static{Facts: h100("575.57.08", "12.9")}),
		provision.WithOverrides(provision.NewOverrides()), provision.WithLockDir(t.TempDir()),
		provision.WithProbeTimeout(30*time.Second), provision.WithProbeDir(t.TempDir()), provision.WithProgress(w.metrics.PullProgress))
	lo.OnResult = w.metrics.ObserveResult
	loop = provision.NewLoop(p, lo)
	w.agent = agent.New(loop, w.rt, agent.Options{ConfigPath: w.config, OverridesPath: w.overrides})
	if err := w.agent.Reload(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); loop.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

// waitFor polls the agent's status until ok holds.
func (w *world) waitFor(t *testing.T, within time.Duration, what string, ok func([]provision.Status) bool) []provision.Status {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		sts := w.agent.Status()
		if ok(sts) {
			return sts
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %s: %v", what, within, sts)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func one(state provision.State, variant string) func([]provision.Status) bool {
	return func(sts []provision.Status) bool {
		return len(sts) == 1 && sts[0].State == state && sts[0].Variant == variant
	}
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.Bytes()
}

func TestAPISimulatedEndpointsAndErrors(t *testing.T) {
	w := newWorld(t, "")
	h := w.agent.Handler()

	// Nothing wanted yet.
	code, _, body := do(t, h, "GET", "/v1/status", "")
	var st agent.StatusResponse
	if code != 200 || json.Unmarshal(body, &st) != nil || st.Engines == nil || len(st.Engines) != 0 {
		t.Fatalf("GET /v1/status: %d %s", code, body)
	}

	code, _, body = do(t, h, "PUT", "/v1/wants", `{"wants":[{"engine":"demo","version":"1.0","ref":"`+w.ref+`"}]}`)
	if code != 200 || !strings.Contains(string(body), `"ref": "`+w.ref+`"`) {
		t.Fatalf("PUT /v1/wants: %d %s", code, body)
	}
	w.waitFor(t, 30*time.Second, "ready", one(provision.Ready, "cu129"))

	code, _, body = do(t, h, "GET", "/v1/status", "")
	if code != 200 || json.Unmarshal(body, &st) != nil || len(st.Engines) != 1 || st.Engines[0].State != provision.Ready || st.Engines[0].Pinned == "" {
		t.Fatalf("GET /v1/status after the want: %d %s", code, body)
	}
	code, _, body = do(t, h, "GET", "/v1/pins", "")
	var pins agent.PinsResponse
	if code != 200 || json.Unmarshal(body, &pins) != nil || len(pins.Pins) != 1 || pins.Pins[0].Key != "demo:1.0" || pins.Pins[0].Ref != st.Engines[0].Pinned {
		t.Fatalf("GET /v1/pins: %d %s", code, body)
	}

	// An override: answered, written to the node's overrides file, and acted on.
	code, _, body = do(t, h, "PUT", "/v1/overrides/demo", `{"override":"none"}`)
	if code != 200 || !strings.Contains(string(body), `"kind": "none"`) {
		t.Fatalf("PUT /v1/overrides/demo: %d %s", code, body)
	}
	if of, err := images.LoadOverrides(w.overrides); err != nil || of.Overrides["demo"] != "none" {
		t.Fatalf("overrides file after PUT: %+v %v", of, err)
	}
	w.waitFor(t, 5*time.Second, "disabled", one(provision.Disabled, ""))

	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		errText                  string
	}{
		{"wants: bad JSON", "PUT", "/v1/wants", `{"wants": [`, 400, "bad JSON"},
		{"wants: not an object", "PUT", "/v1/wants", `[]`, 400, "bad JSON"},
		{"wants: unknown field", "PUT", "/v1/wants", `{"want": []}`, 400, "unknown field"},
		{"wants: missing list", "PUT", "/v1/wants", `{}`, 400, `needs "wants"`},
		{"wants: two values", "PUT", "/v1/wants", `{"wants":[]} {}`, 400, "more than one"},
		{"wants: bad ref", "PUT", "/v1/wants", `{"wants":[{"ref":"reg.example/x:"}]}`, 400, "ref"},
		{"wants: empty ref", "PUT", "/v1/wants", `{"wants":[{"engine":"demo"}]}`, 400, "ref is empty"},
		{"wants: malformed override", "PUT", "/v1/wants", `{"wants":[{"ref":"reg.example/x:1","override":"CU13!"}]}`, 400, "accepted forms"},
		{"wants: twice", "PUT", "/v1/wants", `{"wants":[{"ref":"reg.example/x:1"},{"ref":"reg.example/x:1"}]}`, 400, "wanted twice"},
		{"override: malformed", "PUT", "/v1/overrides/demo", `{"override":"CU13!"}`, 400, "accepted forms"},
		{"override: malformed reference", "PUT", "/v1/overrides/demo", `{"override":"reg/vllm:"}`, 400, "accepted forms"},
		{"override: bad engine name", "PUT", "/v1/overrides/Demo!", `{"override":"auto"}`, 400, "not an engine name"},
		{"override: bad JSON", "PUT", "/v1/overrides/demo", `cu129`, 400, "bad JSON"},
		{"override: missing value", "PUT", "/v1/overrides/demo", `{}`, 400, `needs "override"`},
		{"status: wrong method", "POST", "/v1/status", ``, 405, "method not allowed"},
		{"pins: wrong method", "DELETE", "/v1/pins", ``, 405, "method not allowed"},
		{"wants: wrong method", "GET", "/v1/wants", ``, 405, "method not allowed"},
		{"override: wrong method", "GET", "/v1/overrides/demo", ``, 405, "method not allowed"},
		{"unknown path", "GET", "/v2/status", ``, 404, "no such endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := do(t, h, tc.method, tc.path, tc.body)
			if code != tc.code {
				t.Fatalf("%s %s: %d, want %d: %s", tc.method, tc.path, code, tc.code, body)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var e agent.ErrorResponse
			if err := json.Unmarshal(body, &e); err != nil || !strings.Contains(e.Error, tc.errText) {
				t.Errorf("error body %s (%v), want an error with %q", body, err, tc.errText)
			}
			if code == 405 && hdr.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
	// The refused requests changed nothing.
	if sts := w.agent.Status(); len(sts) != 1 || sts[0].State != provision.Disabled {
		t.Errorf("status after refused requests: %v", sts)
	}
	if of, _ := images.LoadOverrides(w.overrides); of.Overrides["demo"] != "none" {
		t.Errorf("a refused override reached the file: %v", of.Overrides)
	}

	// An engine no want names is taken too, and the answer says so.
	code, _, body = do(t, h, "PUT", "/v1/overrides/sglang", `{"override":"cu129"}`)
	var ovr agent.OverrideResponse
	if code != 200 || json.Unmarshal(body, &ovr) != nil || ovr.Wanted || ovr.Kind != "variant" ||
		!strings.HasPrefix(ovr.Note, "no wanted engine is named sglang now (named: demo); the override is kept") {
		t.Errorf("PUT /v1/overrides/sglang: %d %s", code, body)
	}
	if of, _ := images.LoadOverrides(w.overrides); of.Overrides["sglang"] != "cu129" || of.Overrides["demo"] != "none" {
		t.Errorf("overrides file after an override of an engine not wanted: %v", of.Overrides)
	}

	// The metrics saw it all.
	fams, err := w.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		got[f.GetName()] = f
	}
	if f := got["gpupin_probe_results_total"]; f == nil || counterSum(f, "result", "pass") != 1 {
		t.Errorf("probe results: %v", f)
	}
	if f := got["gpupin_provision_duration_seconds"]; f == nil || len(f.Metric) == 0 {
		t.Errorf("no provision durations: %v", f)
	}
	if f := got["gpupin_pull_bytes_total"]; f == nil || counterSum(f, "engine", "demo") <= 0 {
		t.Errorf("no pull bytes: %v", f)
	}
	if f := got["gpupin_engine_state"]; f == nil || len(f.Metric) != 1 || label(f.Metric[0], "state") != "disabled" {
		t.Errorf("engine state: %v", f)
	}
}

// PUT /v1/wants refuses engine and version values of the wrong grammar,
// and bad references, with 400 before anything is fetched: the registry
// sees no request, and nothing is wanted or pinned.
func TestAPISimulatedWantsRefusesBadNamesBeforeAnyPull(t *testing.T) {
	w := newWorld(t, "")
	h := w.agent.Handler()
	var mu sync.Mutex
	var requests []string
	w.reg.SetHook(func(_ http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.Path)
		mu.Unlock()
		return false
	})
	long := strings.Repeat("a", 4096)
	for _, tc := range []struct {
		name, engine, version, ref string
		errText                    string
	}{
		{"engine with a control character", "de\x01mo", "1.0", w.ref, "not an engine name"},
		{"engine with ESC", "\x1b[31mdemo", "1.0", w.ref, "not an engine name"},
		{"engine with U+202E", "demo\u202e", "1.0", w.ref, "not an engine name"},
		{"engine $(id)", "$(id)", "1.0", w.ref, "not an engine name"},
		{"engine of 4 KiB", long, "1.0", w.ref, "not an engine name"},
		{"version with U+200F", "demo", "\u200f1.0", w.ref, "not an engine version"},
		{"version with ESC", "demo", "1.0\x1b", w.ref, "not an engine version"},
		{"version $(id)", "demo", "$(id)", w.ref, "not an engine version"},
		{"version of 4 KiB", "demo", long, w.ref, "not an engine version"},
		{"bad digest", "demo", "1.0", w.reg.Host + "/demo@sha256:abc", "ref"},
		{"digest not hex", "demo", "1.0", w.reg.Host + "/demo@sha256:" + strings.Repeat("zz", 32), "ref"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := json.Marshal(agent.WantsRequest{Wants: []provision.Want{{Engine: tc.engine, Version: tc.version, Ref: tc.ref}}})
			if err != nil {
				t.Fatal(err)
			}
			code, _, out := do(t, h, "PUT", "/v1/wants", string(body))
			var e agent.ErrorResponse
			if code != 400 || json.Unmarshal(out, &e) != nil || !strings.Contains(e.Error, tc.errText) {
				t.Fatalf("PUT /v1/wants: %d %s; want 400 with %q", code, out, tc.errText)
			}
		})
	}
	// Give a wrongly accepted want the time to start.
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(requests) != 0 {
		t.Errorf("the registry was asked: %v", requests)
	}
	if sts := w.agent.Status(); len(sts) != 0 {
		t.Errorf("statuses after refused wants: %v", sts)
	}
	if pins, err := w.rt.Pins(context.Background()); err != nil || len(pins) != 0 {
		t.Errorf("pins after refused wants: %v %v", pins, err)
	}
}

// A forced variant that fails beside an earlier pin of another variant:
// the API's status and the pin-age metric name the pin's variant, and the
// status says which was attempted.
func TestAgentSimulatedFailedForcedVariantNamesThePinsVariant(t *testing.T) {
	w := newWorld(t, "")
	h := w.agent.Handler()
	if code, _, body := do(t, h, "PUT", "/v1/wants", `{"wants":[{"engine":"demo","version":"1.0","ref":"`+w.ref+`"}]}`); code != 200 {
		t.Fatalf("PUT /v1/wants: %d %s", code, body)
	}
	ready := w.waitFor(t, 30*time.Second, "ready", one(provision.Ready, "cu129"))
	// cu13 on this CUDA 12.9 driver: forced, probed, failed.
	if code, _, body := do(t, h, "PUT", "/v1/overrides/demo", `{"override":"cu13"}`); code != 200 {
		t.Fatalf("PUT /v1/overrides/demo: %d %s", code, body)
	}
	w.waitFor(t, 30*time.Second, "failed", func(sts []provision.Status) bool {
		return len(sts) == 1 && sts[0].State == provision.Failed
	})
	code, _, body := do(t, h, "GET", "/v1/status", "")
	var raw struct {
		Engines []map[string]any `json:"engines"`
	}
	if code != 200 || json.Unmarshal(body, &raw) != nil || len(raw.Engines) != 1 {
		t.Fatalf("GET /v1/status: %d %s", code, body)
	}
	if e := raw.Engines[0]; e["pinned"] != ready[0].Pinned || e["variant"] != "cu129" || e["attempted"] != "cu13" {
		t.Fatalf("status: pinned %v, variant %v, attempted %v; want %s, cu129, cu13", e["pinned"], e["variant"], e["attempted"], ready[0].Pinned)
	}
	fams, err := w.metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range fams {
		if f.GetName() != "gpupin_pin_age_seconds" {
			continue
		}
		for _, m := range f.Metric {
			found = true
			if label(m, "variant") != "cu129" {
				t.Errorf("pin age labelled variant %q; want the pin's cu129", label(m, "variant"))
			}
		}
	}
	if !found {
		t.Error("no pin age metric beside the earlier pin")
	}
}

func counterSum(f *dto.MetricFamily, name, value string) float64 {
	var sum float64
	for _, m := range f.Metric {
		if label(m, name) == value {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func unixClient(sock string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}

func TestAPISimulatedOverUnixSocket(t *testing.T) {
	w := newWorld(t, "wants:\n  - ref: REF\n")
	sock := filepath.Join(t.TempDir(), "run", "agent.sock")
	ln, err := agent.ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: w.agent.Handler()}
	go srv.Serve(ln)
	defer srv.Close()
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v %v", fi, err)
	}
	// A second agent on the same socket is refused, not allowed to steal it.
	if _, err := agent.ListenUnix(sock); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("second listener: %v", err)
	}

	c := unixClient(sock)
	deadline := time.Now().Add(30 * time.Second)
	var st agent.StatusResponse
	for {
		resp, err := c.Get("http://agent/v1/status")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || json.Unmarshal(body, &st) != nil {
			t.Fatalf("status over the socket: %d %s", resp.StatusCode, body)
		}
		if len(st.Engines) == 1 && st.Engines[0].State == provision.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready over the socket: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	req, _ := http.NewRequest("PUT", "http://agent/v1/overrides/demo", bytes.NewBufferString(`{"override":"bogus value"}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"error"`) {
		t.Fatalf("malformed override over the socket: %d %s", resp.StatusCode, body)
	}

	// A socket left by a dead agent is replaced.
	srv.Close()
	ln2, err := agent.ListenUnix(sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
}

// replaceFile writes a file the way editors and `gpupin override` do: a
// new file renamed over the old.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestAgentSimulatedWatchesItsFiles(t *testing.T) {
	w := newWorld(t, "wants:\n  - ref: REF\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.agent.Watch(ctx)
	w.waitFor(t, 30*time.Second, "ready", one(provision.Ready, "cu129"))
	<-w.agent.Watching()

	// An override in the config, by rename: acted on.
	start := time.Now()
	replaceFile(t, w.config, "wants:\n  - ref: "+w.ref+"\noverrides:\n  demo: none\n")
	w.waitFor(t, 30*time.Second, "disabled by the config", one(provision.Disabled, ""))
	t.Logf("a config change took effect in %s", time.Since(start))

	// The node's overrides file wins over the config: written in place.
	if err := os.WriteFile(w.overrides, []byte("overrides:\n  demo: cu129\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, 30*time.Second, "cu129 by the overrides file", func(sts []provision.Status) bool {
		return len(sts) == 1 && sts[0].State == provision.Ready && sts[0].Override == "cu129"
	})

	// A bad edit is refused and the last good wants are kept.
	before := w.agent.Reloads()
	replaceFile(t, w.config, "wantz: []\n")
	deadline := time.Now().Add(30 * time.Second)
	for w.agent.Reloads() == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w.agent.Reloads() == before {
		t.Fatal("the bad edit was never read")
	}
	if sts := w.agent.Status(); len(sts) != 1 || sts[0].State != provision.Ready {
		t.Fatalf("a bad config edit changed the wants: %v", sts)
	}
	if err := w.agent.Reload(); err == nil || !strings.Contains(err.Error(), "wantz") {
		t.Errorf("Reload of a bad config: %v", err)
	}

	// Wanting nothing: no longer reported.
	replaceFile(t, w.config, "wants: []\n")
	w.waitFor(t, 5*time.Second, "no engines", func(sts []provision.Status) bool { return len(sts) == 0 })
}

// The DaemonSet's ConfigMap is a config the agent accepts.
func TestDeployConfigMapIsAValidConfig(t *testing.T) {
	data, err := os.ReadFile("../deploy/kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatalf("manifest does not parse: %v", err)
		}
		if cm.Kind != "ConfigMap" {
			continue
		}
		found = true
		cfg, err := agent.ParseConfig([]byte(cm.Data["agent.yaml"]))
		if err != nil {
			t.Fatalf("the ConfigMap's agent.yaml: %v", err)
		}
		if len(cfg.Wants) == 0 {
			t.Error("the ConfigMap wants nothing")
		}
	}
	if !found {
		t.Fatal("no ConfigMap in the DaemonSet manifest")
	}
}

// During a registry outage an engine wanted by reference alone has no name
// yet (its image names it), and the operator must still be able to say
// none: the API takes the override, says that no wanted engine has that
// name yet and which wants are unnamed, and the loop applies it once the
// registry is back and the engine is named. Before, the API answered 404.
func TestAPISimulatedOverrideBeforeTheEngineIsNamed(t *testing.T) {
	w := newWorldWith(t, "", provision.LoopOptions{RetryMin: 200 * time.Millisecond, Recheck: 2 * time.Second})
	h := w.agent.Handler()
	w.reg.SetDown(true)
	defer w.reg.SetDown(false)
	if code, _, body := do(t, h, "PUT", "/v1/wants", `{"wants":[{"ref":"`+w.ref+`"}]}`); code != 200 {
		t.Fatalf("PUT /v1/wants: %d %s", code, body)
	}
	w.waitFor(t, 30*time.Second, "failed on the registry", func(sts []provision.Status) bool {
		return len(sts) == 1 && sts[0].State == provision.Failed && sts[0].Engine == ""
	})

	code, _, body := do(t, h, "PUT", "/v1/overrides/demo", `{"override":"none"}`)
	var resp agent.OverrideResponse
	note := "no wanted engine is named demo now (named: none); not named yet, their images not read yet: " + w.ref +
		"; the override is kept, and applies to a want from its first plan that names its engine demo"
	if code != 200 || json.Unmarshal(body, &resp) != nil || resp.Wanted || resp.Note != note || resp.Kind != "none" {
		t.Fatalf("PUT /v1/overrides/demo during the outage: %d %s\nwant note %q", code, body, note)
	}
	if of, err := images.LoadOverrides(w.overrides); err != nil || of.Overrides["demo"] != "none" {
		t.Fatalf("overrides file: %+v, %v", of, err)
	}

	// The registry is back: the engine is named demo, and disabled.
	w.reg.SetDown(false)
	sts := w.waitFor(t, 30*time.Second, "disabled", one(provision.Disabled, ""))
	if sts[0].Key != "demo:1.0" || sts[0].Override != "none" {
		t.Fatalf("status %+v; want demo:1.0 under none", sts[0])
	}
	if pins, _ := w.rt.Pins(context.Background()); len(pins) != 0 {
		t.Errorf("pinned under none: %+v", pins)
	}
	// Now named: the answer says so, and auto provisions it.
	code, _, body = do(t, h, "PUT", "/v1/overrides/demo", `{"override":"auto"}`)
	resp = agent.OverrideResponse{}
	if code != 200 || json.Unmarshal(body, &resp) != nil || !resp.Wanted || resp.Note != "" {
		t.Fatalf("PUT /v1/overrides/demo once named: %d %s", code, body)
	}
	w.waitFor(t, 30*time.Second, "ready", one(provision.Ready, "cu129"))
}
