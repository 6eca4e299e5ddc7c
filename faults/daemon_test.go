package faults

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/provision"
)

// containerd is restarted (SIGKILL and start, as a crash and a systemd
// restart) while a probe runs: the provision fails cleanly, a later one
// succeeds, and a sweep leaves nothing behind.
func TestFaultContainerdRestartDuringProbeSimulated(t *testing.T) {
	ctx := context.Background()
	// A daemon of the test's own: restarting the package's would hit
	// every other test.
	d, rt := testenv.OwnContainerd(t, sandbox.ContainerdOptions{})
	reg := testenv.Registry(t)
	hang := cu129
	hang.SimProbe = "hang"
	ref := publish(t, reg, "demo", hang)
	p := newProvisioner(t, rt, testenv.NewNode(h100("580.82.07")), 5*time.Minute)

	done := make(chan provision.Status, 1)
	go func() { done <- p.Provision(ctx, provision.Want{Ref: ref}) }()
	// Two processes in the box (sh and its sleep): the probe is past its
	// start and gpupin is waiting on it.
	waitFor(t, "the probe to hang", func() bool { return probePids(rt) >= 2 })
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	var st provision.Status
	select {
	case st = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the provision did not end after containerd restarted")
	}
	if st.State != provision.Failed || len(st.Attempts) != 1 || st.Attempts[0].Stage != "probe" {
		t.Fatalf("state %s attempts %+v: %s", st.State, st.Attempts, st.Detail)
	}
	t.Logf("failed as: %s", st.Detail)
	// The client reconnects on its own backoff; a caller (the agent) tries
	// again on its next pass, and so does this test.
	waitFor(t, "containerd to answer again", func() bool { _, err := rt.Pins(ctx); return err == nil })
	if ps := pins(t, rt); len(ps) != 0 {
		t.Fatalf("pins after a probe that never finished: %+v", ps)
	}

	// A fixed build under the same tag passes.
	publish(t, reg, "demo", cu129)
	mustReady(t, p.Provision(ctx, provision.Want{Ref: ref}))
	if _, err := rt.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
		t.Errorf("left behind after a sweep: %v", left)
	}
}

// gpupin itself is killed (SIGKILL: an OOM kill, a node drain) in the
// middle of a pull and in the middle of a probe: the pin made before is
// intact, `gpupin gc` sweeps what the dead process left, and a re-run ends
// ready.
func TestFaultGpupinKilledSimulated(t *testing.T) {
	bin := buildGpupin(t)
	nodeFile := filepath.Join(t.TempDir(), "node.json")
	if err := os.WriteFile(nodeFile, []byte(nodeJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	d := testenv.Containerd(t)

	for _, stage := range []string{"pull", "probe"} {
		t.Run("mid-"+stage, func(t *testing.T) {
			reg := testenv.Registry(t)
			rt := testenv.Runtime(t)
			gpupin := func(args ...string) *exec.Cmd {
				global := []string{"--address", d.Address, "--namespace", rt.Namespace(), "--overrides", filepath.Join(t.TempDir(), "overrides.yaml")}
				cmd := exec.Command(bin, append(append(global, args[0], "--node", nodeFile, "--runc-root", d.RuncRoot, "--probe-dir", t.TempDir()), args[1:]...)...)
				if args[0] == "gc" {
					cmd = exec.Command(bin, append(global, "gc")...)
				}
				return cmd
			}
			// The pin that must survive.
			base := publish(t, reg, "base", cu129)
			if out, err := gpupin("provision", base).CombinedOutput(); err != nil {
				t.Fatalf("provision base: %v\n%s", err, out)
			}
			before := pins(t, rt)

			v := cu129
			reached := make(chan struct{})
			if stage == "pull" {
				l, err := sandbox.RandomLayer(4 << 20)
				if err != nil {
					t.Fatal(err)
				}
				v.Layers = append(v.Layers, l)
				dg, _ := l.Digest()
				release := make(chan struct{})
				t.Cleanup(func() { close(release) })
				reg.SetHook(stallBlob(dg.String(), reached, release))
			} else {
				v.SimProbe = "hang"
				go func() {
					for !probeRunning(rt) {
						time.Sleep(20 * time.Millisecond)
					}
					close(reached)
				}()
			}
			ref := publish(t, reg, "demo", v)
			cmd := gpupin("provision", "--probe-timeout", "5m", ref)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-reached:
			case <-time.After(90 * time.Second):
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("gpupin never reached the %s:\n%s", stage, out.String())
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()

			samePins(t, rt, before)
			left := leftovers(t, rt, "overlayfs")
			if len(left) == 0 {
				t.Fatal("a gpupin killed mid-" + stage + " left nothing: the test did not kill it where it meant to")
			}
			t.Logf("left by the killed gpupin: %v", left)

			reg.SetHook(nil)
			if stage == "probe" {
				publish(t, reg, "demo", cu129) // a build whose probe ends
			}
			if out, err := gpupin("gc").CombinedOutput(); err != nil {
				t.Fatalf("gpupin gc: %v\n%s", err, out)
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("gpupin gc left: %v", left)
			}
			samePins(t, rt, before)

			out2, err := gpupin("provision", ref).CombinedOutput()
			if err != nil || !strings.Contains(string(out2), "READY") {
				t.Fatalf("re-run after the kill: %v\n%s", err, out2)
			}
			if ps := pins(t, rt); len(ps) != 2 {
				t.Fatalf("pins after the re-run: %+v", ps)
			}
			if left := leftovers(t, rt, "overlayfs"); len(left) != 0 {
				t.Errorf("the re-run left: %v", left)
			}
		})
	}
}
