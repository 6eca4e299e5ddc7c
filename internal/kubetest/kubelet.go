package kubetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/internal/sandbox"
)

// KubeletOptions says which runtime a standalone kubelet drives and what
// node it claims to be.
type KubeletOptions struct {
	// Endpoint is the CRI endpoint (unix://…): a test's containerd with
	// its CRI plugin on.
	Endpoint string
	// NodeName is the node's name; static pods are named POD-NODENAME.
	NodeName string
	// Labels are the node's labels, which kubelet's admission checks a
	// pod's node affinity against (standalone, there is no scheduler).
	Labels map[string]string
	// Kubeconfig, when set, registers the kubelet with that API server as
	// Node NodeName, and it runs the pods the cluster binds to it.
	Kubeconfig string
	// Wrap is put before kubelet's command line: e.g.
	// sandbox.NodeNS.Enter(), with the node's containerd in the same
	// namespace, so hostPath volumes mean the node's paths.
	Wrap []string
}

// Kubelet is a real kubelet (v1.37.2, built by scripts/kube-tools.sh):
// standalone (no API server, pods from a static pod directory, status read
// from its read-only port), or registered with a cluster's API server
// (KubeletOptions.Kubeconfig). It runs hostNetwork pods only: there is no
// CNI.
type Kubelet struct {
	Dir        string // config, root dir, certificates, pod logs
	StaticPods string // the static pod directory (staticPodPath)
	LogsDir    string // podLogsDir
	ReadOnly   string // http://IP:PORT, the read-only port (/pods)
	// IP is the node's address, where kubelet serves: loopback when
	// standalone; registered with an API server, the host's first
	// non-loopback IPv4 address, as kubelet refuses a loopback node IP
	// there (the Node would have no address, and the API server could not
	// reach it for logs).
	IP string

	healthz string
	proc    *proc
}

// StartKubelet starts a kubelet for one test, stopped when it ends, and
// waits until it serves. A missing binary fails the test: CI builds it.
func StartKubelet(t testing.TB, opts KubeletOptions) *Kubelet {
	t.Helper()
	skipShort(t)
	bin := filepath.Join(Tools(), "kubelet")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubetest: kubelet missing (%v): run scripts/kube-tools.sh (scripts/deps.sh does)", err)
	}
	// Short and under /tmp: kubelet's unix sockets live under its root
	// dir, and a socket path has at most 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "gpupin-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kubelet{Dir: dir, StaticPods: filepath.Join(dir, "manifests"), LogsDir: filepath.Join(dir, "logs"), IP: "127.0.0.1"}
	if opts.Kubeconfig != "" {
		if k.IP, err = hostIP(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(k.Stop)
	for _, d := range []string{k.StaticPods, k.LogsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{
		"--config=" + filepath.Join(dir, "config.yaml"),
		"--root-dir=" + filepath.Join(dir, "root"),
		"--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=" + opts.NodeName,
		// A hostNetwork pod's IP is the node's: loopback, not whatever
		// interface the machine routes through.
		"--node-ip=" + k.IP,
		"--v=2",
	}
	if opts.Kubeconfig != "" {
		args = append(args, "--kubeconfig="+opts.Kubeconfig)
	}
	if len(opts.Labels) > 0 {
		var kv []string
		for k, v := range opts.Labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		args = append(args, "--node-labels="+strings.Join(kv, ","))
	}
	// A port free when chosen can be taken by another test's process
	// before kubelet binds it; kubelet then exits, and a fresh set is tried.
	for attempt := 1; ; attempt++ {
		err := k.start(opts.Wrap, bin, opts.Endpoint, args)
		if err == nil {
			break
		}
		logs := k.LogTail()
		if attempt == 4 || !strings.Contains(logs, "address already in use") {
			t.Fatalf("kubelet: %v\n%s", err, logs)
		}
		stopCmd(k.proc)
		k.proc = nil
	}
	return k
}

// start runs kubelet on fresh ports and waits until it serves.
func (k *Kubelet) start(wrap []string, bin, endpoint string, args []string) error {
	p, err := freePorts(3)
	if err != nil {
		return err
	}
	ports := [3]int(p)
	k.ReadOnly = "http://" + net.JoinHostPort(k.IP, strconv.Itoa(ports[1]))
	k.healthz = "http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/healthz"
	if err := os.WriteFile(filepath.Join(k.Dir, "config.yaml"), []byte(k.config(endpoint, ports)), 0o644); err != nil {
		return err
	}
	if len(wrap) > 0 {
		args = append(append(wrap[1:len(wrap):len(wrap)], bin), args...)
		bin = wrap[0]
	}
	if k.proc, err = startCmd(bin, filepath.Join(k.Dir, "kubelet.log"), args...); err != nil {
		return err
	}
	return k.waitHealthy(60 * time.Second)
}

// config is the KubeletConfiguration: what a kubelet needs on these
// machines (cgroup v1, no swap accounting, no systemd in the way; measured,
// /work/shared/NOTES.md), and nothing that reaches outside Dir but for what
// kubelet cannot move (/var/log/containers links, removed by Stop, and
// /var/lib/kubelet/device-plugins, where it listens for device plugins).
func (k *Kubelet) config(endpoint string, ports [3]int) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: %[1]q
imageServiceEndpoint: %[1]q
staticPodPath: %[2]q
# Kubelet watches the directory with inotify too; the poll is the fallback.
fileCheckFrequency: 1s
podLogsDir: %[3]q
volumePluginDir: %[4]q
address: %[8]s
port: %[5]d
readOnlyPort: %[6]d
healthzBindAddress: 127.0.0.1
healthzPort: %[7]d
# No API server: nothing to ask who may call; the test's calls are local.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
# cgroupfs as containerd's CRI plugin uses it by default; cgroup v1 here,
# no QoS cgroup tree or allocatable enforcement (they need cgroup
# controllers these VMs do not delegate), swap left alone.
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
# The host's iptables is not the test's.
makeIPTablesUtilChains: false
# These VMs refuse a negative OOM score.
oomScoreAdj: 0
# A shared machine's disk must not make kubelet evict or refuse a pod: 0%%
# turns a threshold off, and with one set the others are off too.
evictionHard: {memory.available: "0%%", nodefs.available: "0%%", nodefs.inodesFree: "0%%", imagefs.available: "0%%"}
`, endpoint, k.StaticPods, k.LogsDir, filepath.Join(k.Dir, "volume-plugins"), ports[0], ports[1], ports[2], k.IP)
}

// hostIP is the first IPv4 address of an up, non-loopback interface.
func hostIP() (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("kubetest: no non-loopback IPv4 address for a registered kubelet's node IP")
}

func (k *Kubelet) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-k.proc.done:
			return errors.New("exited at start")
		default:
		}
		if _, err := k.Pods(context.Background()); err != nil {
			last = err.Error()
		} else if resp, err := http.Get(k.healthz); err != nil {
			last = err.Error()
		} else {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %s: %s", limit, last)
}

// WriteStaticPod puts pod into the static pod directory as NAME.yaml
// (written aside, then renamed: kubelet must never read half a file).
func (k *Kubelet) WriteStaticPod(pod *corev1.Pod) error {
	data, err := yaml.Marshal(pod)
	if err != nil {
		return err
	}
	tmp := filepath.Join(k.Dir, pod.Name+".yaml.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(k.StaticPods, pod.Name+".yaml"))
}

// RemoveStaticPod takes NAME.yaml away: kubelet stops the pod.
func (k *Kubelet) RemoveStaticPod(name string) error {
	return os.Remove(filepath.Join(k.StaticPods, name+".yaml"))
}

// Pods is what kubelet's read-only port serves at /pods: the pods it runs,
// with their status.
func (k *Kubelet) Pods(ctx context.Context) ([]corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.ReadOnly+"/pods", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pods: %s: %s", resp.Status, body)
	}
	var list corev1.PodList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET /pods: %w", err)
	}
	return list.Items, nil
}

// Stop stops kubelet (what it ran keeps running: the test's containerd
// owns the containers), removes the /var/log/containers links it made to
// its pod logs, unmounts what is mounted under Dir and removes Dir.
func (k *Kubelet) Stop() {
	if k.proc != nil {
		stopCmd(k.proc)
		k.proc = nil
	}
	links, _ := filepath.Glob("/var/log/containers/*.log")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, k.Dir+"/") {
			os.Remove(l)
		}
	}
	sandbox.UnmountUnder(k.Dir)
	if err := os.RemoveAll(k.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "kubetest: leaving %s: %v\n", k.Dir, err)
	}
}

// LogTail is the end of kubelet's log.
func (k *Kubelet) LogTail() string { return tail(filepath.Join(k.Dir, "kubelet.log")) }
