package sandbox_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// The daemon is the one asked for ($GPUPIN_TEST_CONTAINERD or PATH), says
// its version, and answers the containerd client with the same one.
func TestContainerdVersion(t *testing.T) {
	d, _ := testenv.OwnContainerd(t, sandbox.ContainerdOptions{})
	if env := os.Getenv(sandbox.EnvContainerd); env != "" && (d.Major < 2 || d.BinDir == "") {
		t.Fatalf("%s=%s but the daemon is %s (%s)", sandbox.EnvContainerd, env, d.Version, d.Bin)
	}
	cl, err := client.New(d.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v, err := cl.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimPrefix(v.Version, "v") != d.Version {
		t.Fatalf("daemon says %q, Version is %q", v.Version, d.Version)
	}
	if out, err := exec.Command(d.Ctr(), "--version").Output(); err != nil {
		t.Fatal(err)
	} else if d.BinDir != "" && !strings.Contains(string(out), d.Version) {
		t.Fatalf("ctr %s is not the daemon's %s: %s", d.Ctr(), d.Version, out)
	}
	t.Logf("containerd %s (%s)", d.Version, d.Bin)
}

// crictl runs crictl against the daemon's CRI endpoint and returns its
// stdout; an error carries its stderr.
func crictl(t *testing.T, d *sandbox.Containerd, args ...string) (string, error) {
	t.Helper()
	ep := d.CRIEndpoint()
	cmd := exec.Command(testenv.Crictl(t), append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "20s"}, args...)...)
	// crictl reads /etc/crictl.yaml; the flags win, and no config of the
	// host's may add to them.
	cmd.Env = append(os.Environ(), "CRI_CONFIG_FILE=/dev/null")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("crictl %s: %w: %s", args[0], err, stderr.String())
	}
	return string(out), err
}

// The CRI plugin is off unless asked for. On, crictl reaches it on the
// daemon's socket and runs a host-network pod with no CNI, from the
// configured sandbox image, which the plugin pulls from a loopback
// registry through the certs.d directory it was given.
func TestContainerdCRI(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		d, _ := testenv.OwnContainerd(t, sandbox.ContainerdOptions{})
		// The daemon answers, but not the CRI service: gRPC's Unimplemented.
		if out, err := crictl(t, d, "version"); err == nil || !strings.Contains(err.Error(), "Unimplemented") {
			t.Fatalf("crictl version with the CRI plugin off: %v: %s", err, out)
		}
	})
	t.Run("on", func(t *testing.T) {
		ctx := context.Background()
		reg := testenv.Registry(t)
		pause, err := sandbox.Image(sandbox.ImageSpec{Entrypoint: []string{"sleep", "3600"}})
		if err != nil {
			t.Fatal(err)
		}
		pauseRef := reg.Host + "/gpupin-test/pause:1"
		if _, err := sandbox.PushImage(ctx, pauseRef, pause); err != nil {
			t.Fatal(err)
		}
		certsD := t.TempDir()
		os.MkdirAll(filepath.Join(certsD, reg.Host), 0o755)
		hosts := fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+reg.Host, "http://"+reg.Host)
		if err := os.WriteFile(filepath.Join(certsD, reg.Host, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
		d, _ := testenv.OwnContainerd(t, sandbox.ContainerdOptions{CRI: true, SandboxImage: pauseRef, RegistryConfigPath: certsD})
		out, err := crictl(t, d, "info")
		if err != nil {
			t.Fatalf("%v\n%s", err, d.LogTail())
		}
		for _, want := range []string{`"RuntimeReady"`, d.CRIRuncRoot} {
			if !strings.Contains(out, want) {
				t.Errorf("crictl info lacks %q:\n%s", want, out)
			}
		}
		podCfg := filepath.Join(t.TempDir(), "pod.json")
		// network 2 is NODE: the host's network, so no CNI is needed.
		pod := fmt.Sprintf(`{"metadata":{"name":"cri-test","namespace":"default","uid":"cri-test-uid"},"log_directory":%q,"linux":{"security_context":{"namespace_options":{"network":2}}}}`, t.TempDir())
		if err := os.WriteFile(podCfg, []byte(pod), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err = crictl(t, d, "runp", podCfg)
		if err != nil {
			t.Fatalf("%v\n%s", err, d.LogTail())
		}
		id := strings.TrimSpace(out)
		if out, err := crictl(t, d, "inspectp", id); err != nil || !strings.Contains(out, "SANDBOX_READY") {
			t.Fatalf("inspectp: %v: %s", err, out)
		}
		if out, err := crictl(t, d, "images", "-q", pauseRef); err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("crictl images %s: %v: %q", pauseRef, err, out)
		}
		for _, args := range [][]string{{"stopp", id}, {"rmp", id}} {
			if _, err := crictl(t, d, args...); err != nil {
				t.Fatal(err)
			}
		}

		// A pod left running (a test that failed half-way) ends with the
		// daemon: Stop deletes what is left in the runc roots.
		out, err = crictl(t, d, "runp", podCfg)
		if err != nil {
			t.Fatal(err)
		}
		out, err = crictl(t, d, "inspectp", "-o", "json", strings.TrimSpace(out))
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			Info struct{ Pid int } `json:"info"`
		}
		if err := json.Unmarshal([]byte(out), &info); err != nil || info.Info.Pid == 0 {
			t.Fatalf("no pid in crictl inspectp: %v: %s", err, out)
		}
		d.Stop()
		// Dead is gone or a zombie: the process is reparented to PID 1,
		// which reaps it in its own time.
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", info.Info.Pid)); err == nil && !strings.Contains(string(st), "State:\tZ") {
			syscall.Kill(info.Info.Pid, syscall.SIGKILL)
			t.Fatalf("the pod's pause process %d outlived Stop: %s", info.Info.Pid, st)
		}
	})
}

// docker-registry with no auth, with htpasswd auth, with TLS from a test
// CA, and with client certificates: each takes a push from a client that
// is let in, and refuses one that is not.
func TestDistribution(t *testing.T) {
	ctx := context.Background()
	img, err := sandbox.Image(sandbox.ImageSpec{Cmd: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	ca := testenv.CA(t)
	server, err := ca.Server("registry")
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := ca.Client("client", "gpupin-test-client")
	if err != nil {
		t.Fatal(err)
	}
	push := func(d *sandbox.Distribution, opts ...remote.Option) error {
		ref, err := name.ParseReference(d.Host + "/test/img:1")
		if err != nil {
			return err
		}
		return remote.Write(ref, img, append(opts, remote.WithContext(ctx))...)
	}
	status := func(err error) int {
		var te *transport.Error
		if errors.As(err, &te) {
			return te.StatusCode
		}
		return 0
	}

	t.Run("plain", func(t *testing.T) {
		d := testenv.Distribution(t, sandbox.DistributionOptions{})
		if err := push(d, d.Remote(nil)...); err != nil {
			t.Fatalf("push: %v\n%s", err, d.LogTail())
		}
		ref, err := name.ParseReference(d.Host + "/test/img:1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Get(ref, d.Remote(nil)...); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("htpasswd", func(t *testing.T) {
		d := testenv.Distribution(t, sandbox.DistributionOptions{User: "gpupin", Password: "s3cret"})
		if err := push(d); status(err) != http.StatusUnauthorized {
			t.Fatalf("push without credentials: %v, want 401", err)
		}
		if err := push(d, d.Remote(nil)...); err != nil {
			t.Fatalf("push with credentials: %v\n%s", err, d.LogTail())
		}
	})
	t.Run("tls", func(t *testing.T) {
		d, ca := testenv.TLSDistribution(t, sandbox.DistributionOptions{})
		if !strings.HasPrefix(d.URL(), "https://") {
			t.Fatalf("URL %s", d.URL())
		}
		if err := push(d, d.Remote(nil)...); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("push trusting the system roots only: %v, want a certificate error", err)
		}
		if err := push(d, d.Remote(ca.Pool())...); err != nil {
			t.Fatalf("push trusting the test CA: %v\n%s", err, d.LogTail())
		}
	})
	t.Run("client-cert", func(t *testing.T) {
		d := testenv.Distribution(t, sandbox.DistributionOptions{CertFile: server.CertFile, KeyFile: server.KeyFile, ClientCAs: []string{ca.CertFile}})
		if err := push(d, d.Remote(ca.Pool())...); err == nil {
			t.Fatal("push without a client certificate succeeded")
		}
		pair, err := tls.LoadX509KeyPair(clientCert.CertFile, clientCert.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		tr := remote.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}}
		if err := push(d, remote.WithTransport(tr)); err != nil {
			t.Fatalf("push with a client certificate: %v\n%s", err, d.LogTail())
		}
	})
}

// Registries gives one registry of each kind, each serving a push.
func TestRegistries(t *testing.T) {
	regs := testenv.Registries(t)
	if len(regs) != 2 {
		t.Fatalf("%d registries", len(regs))
	}
	for _, reg := range regs {
		t.Run(reg.Name, func(t *testing.T) {
			if _, err := sandbox.PublishEngine(context.Background(), reg.Host, "demo", "1.0.0", []sandbox.EngineVariant{testenv.CU129}); err != nil {
				t.Fatal(err)
			}
			if (reg.InProcess != nil) != (reg.Name == "ggcr") {
				t.Fatalf("%s: InProcess %v", reg.Name, reg.InProcess)
			}
		})
	}
}

// A daemon whose owner is killed (as go test kills a binary at its
// -timeout, running no cleanups) leaves a container running; the next
// StartContainerd stops it and removes the directory.
func TestReapAfterOwnerKilled(t *testing.T) {
	if os.Getenv("GPUPIN_SANDBOX_REAP_CHILD") != "" {
		return // the child's part runs in TestMain's stead: see reapChild
	}
	testenv.RequireRoot(t)
	ctx := context.Background()
	reg := testenv.Registry(t)
	img, err := sandbox.Image(sandbox.ImageSpec{Entrypoint: []string{"sleep", "3600"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/reap/sleep:1"
	if _, err := sandbox.PushImage(ctx, ref, img); err != nil {
		t.Fatal(err)
	}

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "GPUPIN_SANDBOX_REAP_CHILD=1")
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	var dir, address, runcRoot, ctr string
	if _, err := fmt.Fscanln(stdout, &dir, &address, &runcRoot, &ctr); err != nil {
		t.Fatalf("the child's daemon: %v", err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(ctr, append([]string{"--address", address, "--namespace", "reap"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v: %s", args[0], err, out)
		}
		return string(out)
	}
	run("images", "pull", "--plain-http", ref)
	run("run", "-d", "--runc-root", runcRoot, ref, "sleeper")
	var pid int
	for _, line := range strings.Split(run("tasks", "ls"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "sleeper" {
			fmt.Sscan(f[1], &pid)
		}
	}
	if pid == 0 {
		t.Fatal("no pid for the container")
	}

	child.Process.Kill()
	child.Wait()
	d, _ := testenv.OwnContainerd(t, sandbox.ContainerdOptions{})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there (%v); new daemon %s", dir, err, d.Dir)
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil && !strings.Contains(string(st), "State:\tZ") {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the container's process %d outlived its daemon's owner: %s", pid, st)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv("GPUPIN_SANDBOX_REAP_CHILD") != "" {
		reapChild()
		return
	}
	os.Exit(m.Run())
}

// reapChild starts a daemon, says where it is, and waits to be killed.
func reapChild() {
	d, err := sandbox.StartContainerd(context.Background(), sandbox.ContainerdOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(d.Dir, d.Address, d.RuncRoot, d.Ctr())
	time.Sleep(time.Hour)
}

// containerd (through ctr) pulls from docker-registry over TLS with the
// test CA named in a certs.d hosts.toml, and with htpasswd credentials.
func TestContainerdPullsFromTLSDistribution(t *testing.T) {
	d, _ := testenv.OwnContainerd(t, sandbox.ContainerdOptions{})
	reg, ca := testenv.TLSDistribution(t, sandbox.DistributionOptions{User: "gpupin", Password: "s3cret"})
	img, err := sandbox.Image(sandbox.ImageSpec{Cmd: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/tls/img:1"
	tag, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, reg.Remote(ca.Pool())...); err != nil {
		t.Fatal(err)
	}
	certsD := t.TempDir()
	os.MkdirAll(filepath.Join(certsD, reg.Host), 0o755)
	// A [host] entry with the CA (containerd 1.6.20 refuses a hosts.toml
	// without one: "invalid `host` tree"). The server line is the fallback
	// containerd tries last, without the CA: a pull that succeeds went
	// through the entry, since no system root knows the test CA.
	hosts := fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = %q\n", reg.URL(), reg.URL(), ca.CertFile)
	if err := os.WriteFile(filepath.Join(certsD, reg.Host, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	pull := func(extra ...string) (string, error) {
		args := append([]string{"--address", d.Address, "--namespace", "tls", "images", "pull", "--hosts-dir", certsD}, extra...)
		out, err := exec.Command(d.Ctr(), append(args, ref)...).CombinedOutput()
		return string(out), err
	}
	// Refused for want of credentials, past the TLS handshake (1.6 says
	// 401, 2.x "authorization failed: no basic auth credentials").
	if out, err := pull(); err == nil || !(strings.Contains(out, "401") || strings.Contains(out, "authorization")) {
		t.Fatalf("pull without credentials: %v: %s", err, out)
	}
	if out, err := pull("--user", reg.User+":"+reg.Password); err != nil {
		t.Fatalf("pull: %v: %s\n%s", err, out, reg.LogTail())
	}
}
