package agent_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// buildBinaries builds gpupin, and the library example so it is known to
// compile, into a temporary directory.
func buildBinaries(t *testing.T) string {
	t.Helper()
	testenv.Daemons(t)
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/gpupin", "./examples/agent")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "gpupin")
}

// agentProc is a running `gpupin agent`, its JSON log collected.
type agentProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any
	done chan struct{}
}

func startAgent(t *testing.T, bin string, args []string) *agentProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				m = map[string]any{"msg": sc.Text()}
			}
			p.mu.Lock()
			p.logs = append(p.logs, m)
			p.mu.Unlock()
		}
		cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *agentProc) find(msg string) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.logs {
		if m["msg"] == msg {
			return m
		}
	}
	return nil
}

func (p *agentProc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, m := range p.logs {
		j, _ := json.Marshal(m)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// managed counts what gpupin made in the namespace: leases, and image
// records that are candidates rather than pins.
func managed(t *testing.T, rt *containerd.Runtime) (leases, candidates int) {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	ls, err := rt.Client().LeasesService().List(ctx, fmt.Sprintf(`labels.%q`, containerd.LabelManaged))
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := rt.Client().ImageService().List(ctx, fmt.Sprintf(`labels.%q==candidate`, containerd.LabelRole))
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if img.Labels[containerd.LabelPin] == "" && img.Labels[containerd.LabelPrevious] == "" {
			candidates++
		}
	}
	return len(ls), candidates
}

func TestAgentSimulatedKilledMidPullRecovers(t *testing.T) {
	bin := buildBinaries(t)
	ctx := context.Background()
	d := testenv.Containerd(t)
	rt := testenv.Runtime(t)
	reg := testenv.Registry(t)
	ref := reg.Host + "/demo:1.0"

	// The engine was provisioned on this node before: the old pin.
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}
	p := testenv.Provisioner(t, rt, provision.WithNode(node.Static{Facts: h100("575.57.08", "12.9")}), provision.WithOverrides(provision.NoOverrides()),
		provision.WithLockDir(t.TempDir()), provision.WithProbeDir(t.TempDir()))
	if st := p.Provision(ctx, provision.Want{Ref: ref}); st.State != provision.Ready {
		t.Fatalf("first provision: %s", st)
	}
	oldPin, err := rt.GetPin(ctx, "demo:1.0")
	if err != nil || oldPin == nil {
		t.Fatalf("old pin: %v %v", oldPin, err)
	}

	// A rebuild under the tag with a layer of its own, whose fetch stalls,
	// and a driver upgrade: the agent must re-prove, so it pulls.
	layer, err := sandbox.RandomLayer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	ld, _ := layer.Digest()
	rebuilt := cu129
	rebuilt.Layers = append(rebuilt.Layers, layer)
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{rebuilt}); err != nil {
		t.Fatal(err)
	}
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
			once.Do(func() { close(stalled) })
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return false
	})
	defer close(release)

	dir := t.TempDir()
	upgraded := h100("580.82.07", "13.0")
	nodeFile := filepath.Join(dir, "node.json")
	data, _ := json.Marshal(upgraded)
	os.WriteFile(nodeFile, data, 0o644)
	config := filepath.Join(dir, "agent.yaml")
	os.WriteFile(config, []byte("wants:\n  - engine: demo\n    version: \"1.0\"\n    ref: "+ref+"\n"), 0o644)
	sock := filepath.Join(dir, "agent.sock")
	args := []string{"--address", d.Address, "--namespace", rt.Namespace(), "--node", nodeFile,
		"--overrides", filepath.Join(dir, "overrides.yaml"), "--log-format", "json",
		"agent", "--config", config, "--socket", sock, "--runc-root", d.RuncRoot,
		"--cdi-spec-dir", filepath.Join(dir, "cdi"), "--probe-dir", filepath.Join(dir, "probe"), "--probe-timeout", "30s",
		"--lock-dir", filepath.Join(dir, "locks")}

	first := startAgent(t, bin, args)
	select {
	case <-stalled:
	case <-first.done:
		t.Fatalf("the agent exited before the pull:\n%s", first.logText())
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent never fetched the new layer:\n%s", first.logText())
	}
	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done

	// Killed mid-pull: the old pin is as it was, and the pull left its lease.
	if pin, err := rt.GetPin(ctx, "demo:1.0"); err != nil || pin == nil || *pin != *oldPin {
		t.Fatalf("the old pin changed under a killed pull:\nbefore %+v\nafter  %+v (%v)", oldPin, pin, err)
	}
	if leases, _ := managed(t, rt); leases == 0 {
		t.Fatal("no lease left by the killed pull: the kill did not land mid-pull")
	}

	// Started again, with the registry serving: sweeps, then ends ready.
	reg.SetHook(nil)
	second := startAgent(t, bin, args)
	c := unixClient(sock)
	var st agent.StatusResponse
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := c.Get("http://agent/v1/status"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if json.Unmarshal(body, &st) == nil && len(st.Engines) == 1 && st.Engines[0].State == provision.Ready {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after the restart: %+v\n%s", st, second.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
	swept := second.find("swept leftovers of interrupted runs")
	if swept == nil || swept["leases"].(float64) < 1 {
		t.Fatalf("the restart did not sweep the killed pull's lease: %v\n%s", swept, second.logText())
	}
	e := st.Engines[0]
	if e.FromPin || e.Pin == nil || e.Pin.Node != upgraded.Fingerprint() || e.Pinned == oldPin.Ref {
		t.Fatalf("after the restart: %+v", e)
	}
	pin, err := rt.GetPin(ctx, "demo:1.0")
	if err != nil || pin == nil || pin.Ref != e.Pinned {
		t.Fatalf("pin in containerd %+v (%v), status says %s", pin, err, e.Pinned)
	}

	// SIGTERM: a clean stop, socket removed, nothing left behind.
	second.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop within 30s of SIGTERM")
	}
	if code := second.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM:\n%s", code, second.logText())
	}
	if second.find("agent stopped") == nil {
		t.Errorf("no clean stop logged:\n%s", second.logText())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after a clean stop: %v", err)
	}
	if leases, candidates := managed(t, rt); leases != 0 || candidates != 0 {
		t.Errorf("left behind: %d leases, %d candidate records", leases, candidates)
	}
}
