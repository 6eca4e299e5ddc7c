package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
)

// runningProbes lists the probe containers of the namespace whose task runs.
func runningProbes(t *testing.T, rt *containerd.Runtime) []string {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	conts, err := rt.Client().Containers(ctx, fmt.Sprintf(`labels.%q==probe`, containerd.LabelRole))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range conts {
		if task, err := c.Task(ctx, nil); err == nil {
			if st, err := task.Status(ctx); err == nil && st.Status == "running" {
				ids = append(ids, c.ID())
			}
		}
	}
	return ids
}

// containerGone reports whether a container no longer exists.
func containerGone(t *testing.T, rt *containerd.Runtime, id string) bool {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), rt.Namespace())
	_, err := rt.Client().LoadContainer(ctx, id)
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return errdefs.IsNotFound(err)
}

// procState is field 3 of /proc/PID/stat ("Z" for a zombie), "" once gone.
func procState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// unreaped reports whether a process has exited and waits to be reaped:
// a zombie whose other threads are gone too. (The leader of a threaded
// process shows Z while its other threads still exit, holding its files:
// its socket, say.)
func unreaped(pid int) bool {
	if procState(pid) != "Z" {
		return false
	}
	threads, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return err == nil && len(threads) == 1
}

// A probe whose owner dies after the agent started (its start sweep saw
// the owner alive) is stopped by the agent's periodic sweep, whether the
// owner was reaped or lingers as a zombie; a live owner's probe is not.
func TestAgentSimulatedPeriodicSweepStopsOrphanedProbe(t *testing.T) {
	for _, tc := range []struct {
		name string
		reap bool
	}{
		{"owner-reaped", true},
		{"owner-zombie", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rt := testenv.Runtime(t)
			reg := testenv.Registry(t)
			img, err := sandbox.Image(sandbox.ImageSpec{})
			if err != nil {
				t.Fatal(err)
			}
			d, err := sandbox.PushImage(ctx, reg.Host+"/probe:1", img)
			if err != nil {
				t.Fatal(err)
			}
			ref := reg.Host + "/probe@" + d.String()
			if _, err := rt.Pull(ctx, ref, containerd.PullOptions{}); err != nil {
				t.Fatal(err)
			}

			// The owner: another process of this pid namespace (a
			// `gpupin provision` beside the agent, say).
			ownerProc := exec.Command("sleep", "600")
			if err := ownerProc.Start(); err != nil {
				t.Fatal(err)
			}
			reaped := false
			defer func() {
				if !reaped {
					ownerProc.Process.Kill()
					ownerProc.Wait()
				}
			}()
			// A probe it owns. Run waits on it here; the sweep only reads
			// the owner label, as it would for a probe whose gpupin died.
			ran := make(chan error, 1)
			go func() {
				_, err := rt.Run(ctx, containerd.RunSpec{Image: ref, Role: "probe", Hardened: true, Args: []string{"sleep", "600"},
					Labels: map[string]string{containerd.LabelOwner: containerd.OwnerOf(ownerProc.Process.Pid)}})
				ran <- err
			}()
			waitUntil(t, 30*time.Second, "the probe runs", func() bool { return len(runningProbes(t, rt)) == 1 })

			p := testenv.Provisioner(t, rt, provision.WithNode(node.Static{Facts: h100("575.57.08", "12.9")}), provision.WithOverrides(provision.NoOverrides()),
				provision.WithLockDir(t.TempDir()), provision.WithProbeDir(t.TempDir()))
			loop := provision.NewLoop(p, provision.LoopOptions{})
			a := agent.New(loop, rt, agent.Options{SweepEvery: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			wctx, cancel := context.WithCancel(ctx)
			watched := make(chan struct{})
			go func() { a.Maintain(wctx); close(watched) }()
			defer func() { cancel(); <-watched }()

			// Sweeps while the owner lives leave its probe alone.
			waitUntil(t, 30*time.Second, "three sweeps", func() bool { return a.Sweeps() >= 3 })
			select {
			case err := <-ran:
				t.Fatalf("a live owner's probe was stopped: %v", err)
			default:
			}

			ownerProc.Process.Signal(syscall.SIGKILL)
			if tc.reap {
				ownerProc.Wait()
				reaped = true
			} else {
				waitUntil(t, 10*time.Second, "the owner is a zombie", func() bool { return procState(ownerProc.Process.Pid) == "Z" })
			}
			select {
			case <-ran:
			case <-time.After(30 * time.Second):
				t.Fatalf("the orphaned probe still runs 30 s after its owner died (%d sweeps)", a.Sweeps())
			}
			if !tc.reap && procState(ownerProc.Process.Pid) != "Z" {
				t.Fatal("the owner stopped being a zombie before the sweep: the test proved nothing")
			}
			if ids := runningProbes(t, rt); len(ids) != 0 {
				t.Errorf("probes still running: %v", ids)
			}
		})
	}
}

// The case: an agent killed mid-probe and started again within a
// second, before the old one is reaped. The old probe must not run on: the
// new agent's sweep counts the zombie as the dead process it is.
func TestAgentSimulatedKilledMidProbeRestartedWithinASecond(t *testing.T) {
	bin := buildBinaries(t)
	ctx := context.Background()
	d := testenv.Containerd(t)
	rt := testenv.Runtime(t)
	reg := testenv.Registry(t)
	ref := reg.Host + "/demo:1.0"
	hang := cu129
	hang.SimProbe = "hang"
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{hang}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	nodeFile := filepath.Join(dir, "node.json")
	data, _ := json.Marshal(h100("580.82.07", "13.0"))
	os.WriteFile(nodeFile, data, 0o644)
	config := filepath.Join(dir, "agent.yaml")
	os.WriteFile(config, []byte("wants:\n  - engine: demo\n    version: \"1.0\"\n    ref: "+ref+"\n"), 0o644)
	sock := filepath.Join(dir, "agent.sock")
	args := []string{"--address", d.Address, "--namespace", rt.Namespace(), "--node", nodeFile,
		"--overrides", filepath.Join(dir, "overrides.yaml"), "--log-format", "json",
		"agent", "--config", config, "--socket", sock, "--runc-root", d.RuncRoot,
		"--cdi-spec-dir", filepath.Join(dir, "cdi"), "--probe-dir", filepath.Join(dir, "probe"), "--probe-timeout", "10m",
		"--lock-dir", filepath.Join(dir, "locks")}

	// The first agent logs to a file, not a pipe: nothing here waits on
	// it, so once killed it stays a zombie until the test reaps it.
	logFile, err := os.Create(filepath.Join(dir, "first.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	first := exec.Command(bin, args...)
	first.Stderr = logFile
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := false
	defer func() {
		if !reaped {
			first.Process.Kill()
			first.Wait()
		}
	}()
	var probes []string
	waitUntil(t, 90*time.Second, "the first agent's probe runs", func() bool {
		probes = runningProbes(t, rt)
		return len(probes) == 1
	})
	// A build whose probe ends, for the second agent.
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}

	killed := time.Now()
	first.Process.Signal(syscall.SIGKILL)
	waitUntil(t, 10*time.Second, "the first agent is a zombie", func() bool { return unreaped(first.Process.Pid) })
	second := startAgent(t, bin, args)
	t.Logf("the second agent started %s after the kill", time.Since(killed).Round(time.Millisecond))

	for deadline := time.Now().Add(60 * time.Second); !containerGone(t, rt, probes[0]); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned probe %s still there after 60 s; the second agent logged:\n%s", probes[0], second.logText())
		}
	}
	if !unreaped(first.Process.Pid) {
		t.Fatal("the first agent was reaped before its probe was removed: the test proved nothing")
	}
	// The sweep logs once it is done, after the removal just seen.
	var swept map[string]any
	waitUntil(t, 30*time.Second, "the second agent logs its sweep", func() bool {
		swept = second.find("swept leftovers of interrupted runs")
		return swept != nil
	})
	if swept["containers"].(float64) < 1 {
		t.Errorf("the second agent logged no sweep of the probe: %v\n%s", swept, second.logText())
	}
	first.Wait()
	reaped = true

	// The second agent goes on to prove the new build.
	c := unixClient(sock)
	var st agent.StatusResponse
	waitUntil(t, 60*time.Second, "ready", func() bool {
		resp, err := c.Get("http://agent/v1/status")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return json.Unmarshal(body, &st) == nil && len(st.Engines) == 1 && st.Engines[0].State == provision.Ready
	})
	second.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the second agent did not stop within 30s of SIGTERM")
	}
	if ids := runningProbes(t, rt); len(ids) != 0 {
		t.Errorf("probes still running: %v", ids)
	}
	if leases, candidates := managed(t, rt); leases != 0 || candidates != 0 {
		t.Errorf("left behind: %d leases, %d candidate records", leases, candidates)
	}
}

// waitUntil polls cond; the limit only keeps a broken test from hanging.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting (%s) for: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
