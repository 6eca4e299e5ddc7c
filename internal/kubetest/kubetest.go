// Package kubetest starts real Kubernetes parts for tests: a control plane
// (etcd v3.6.16 and kube-apiserver v1.37.2) on loopback, in a temporary
// directory, with RBAC, ValidatingAdmissionPolicy, static-token users and
// service-account tokens; and a standalone kubelet v1.37.2 over a test's
// containerd (kubelet.go). scripts/kube-tools.sh builds them into
// $GPUPIN_TOOLS/kube-1.37.2. A missing binary fails the test: CI builds
// them.
package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// Version is the Kubernetes release the harness runs.
const Version = "1.37.2"

// AdminToken is the static token of the admin user (group system:masters).
const AdminToken = "gpupin-test-admin"

// Tools is the directory holding etcd, kube-apiserver and kubelet.
func Tools() string {
	if d := os.Getenv("GPUPIN_KUBE_TOOLS"); d != "" {
		return d
	}
	base := os.Getenv("GPUPIN_TOOLS")
	if base == "" {
		base = "/var/tmp/gpupin-tools"
	}
	return filepath.Join(base, "kube-"+Version)
}

// User is a static-token identity of the test cluster.
type User struct {
	Name   string
	Groups []string
}

// Cluster is a running etcd + kube-apiserver.
type Cluster struct {
	Dir  string
	Host string // https://127.0.0.1:PORT
	// CA is the PEM of the serving certificate's CA.
	CA []byte

	port     int
	etcdURL  string
	users    map[string]User // by token
	mu       sync.Mutex
	etcd     *proc
	apiserve *proc
	kcm      *proc // kube-controller-manager, after StartControllers
	sched    *proc // kube-scheduler, after StartControllers
}

// proc is a daemon; done closes when it has exited.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a cluster for the whole test binary (call Stop when done)
// with the static users given besides the admin; each user's token is its
// name. Use from TestMain or a sync.Once.
func Start(users ...User) (*Cluster, error) {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(Tools(), b)); err != nil {
			return nil, fmt.Errorf("kubetest: %s missing (%w): run scripts/kube-tools.sh (scripts/deps.sh does)", b, err)
		}
	}
	dir, err := os.MkdirTemp("", "gpupin-kube-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, users: map[string]User{AdminToken: {Name: "admin", Groups: []string{"system:masters"}}}}
	for _, u := range users {
		c.users[u.Name] = u
	}
	if err := c.writeFiles(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.startEtcd(); err != nil {
		c.Stop()
		return nil, err
	}
	if c.port, err = freePort(); err != nil {
		c.Stop()
		return nil, err
	}
	c.Host = "https://127.0.0.1:" + strconv.Itoa(c.port)
	if err := c.StartAPIServer(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Config is a client config for the user with this token.
func (c *Cluster) Config(token string) *rest.Config {
	return &rest.Config{Host: c.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CA},
		QPS: 100, Burst: 200}
}

// Admin is a client config for the admin.
func (c *Cluster) Admin() *rest.Config { return c.Config(AdminToken) }

// Kubeconfig writes a kubeconfig file for the token and returns its path.
func (c *Cluster) Kubeconfig(token string) (string, error) {
	p := filepath.Join(c.Dir, "kubeconfig-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	ca := filepath.Join(c.Dir, "ca.crt")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: user
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: user}
current-context: test
`, c.Host, ca, token)
	return p, os.WriteFile(p, []byte(data), 0o600)
}

// StopAPIServer stops kube-apiserver (etcd stays): an API outage.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopCmd(c.apiserve)
	c.apiserve = nil
}

// StartAPIServer starts kube-apiserver on the cluster's port and waits
// until it is ready.
func (c *Cluster) StartAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.Dir
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.port),
		"--cert-dir=" + filepath.Join(d, "certs"),
		"--tls-cert-file=" + filepath.Join(d, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(d, "serving.key"),
		"--token-auth-file=" + filepath.Join(d, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(d, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(d, "sa.key"),
		"--api-audiences=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		// As kubeadm and managed clusters run it: the agent's DaemonSet is
		// privileged (the chart's test installs it).
		"--allow-privileged=true",
		// Kubelets are reached (logs, exec) at their node IP: the test's
		// node names resolve nowhere.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		// What these tests use: namespaces, service accounts, and the
		// policies that bind an agent to its own node's object.
		"--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,ValidatingAdmissionPolicy",
		"--disable-admission-plugins=LimitRanger,TaintNodesByCondition,PodSecurity,Priority,DefaultTolerationSeconds," +
			"DefaultStorageClass,StorageObjectInUseProtection,PersistentVolumeClaimResize,RuntimeClass,CertificateApproval," +
			"CertificateSigning,ClusterTrustBundleAttest,CertificateSubjectRestriction,DefaultIngressClass," +
			"MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota",
		"--v=1",
	}
	cmd, err := startCmd(filepath.Join(Tools(), "kube-apiserver"), filepath.Join(d, "kube-apiserver.log"), args...)
	if err != nil {
		return err
	}
	c.apiserve = cmd
	if err := c.waitReady(90 * time.Second); err != nil {
		stopCmd(cmd)
		c.apiserve = nil
		return fmt.Errorf("kube-apiserver: %w\n%s", err, tail(filepath.Join(d, "kube-apiserver.log")))
	}
	return nil
}

// StartControllers starts kube-controller-manager (every default
// controller: the DaemonSet's and Deployment's, garbage collection, the
// root CA's publisher for in-cluster clients) and kube-scheduler, both as
// the admin, and waits until each serves its health check: with them the
// cluster makes and places pods, as a real one does.
func (c *Cluster) StartControllers() error {
	for _, b := range []string{"kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(Tools(), b)); err != nil {
			return fmt.Errorf("kubetest: %s missing (%w): run scripts/kube-tools.sh (scripts/deps.sh does)", b, err)
		}
	}
	kc, err := c.Kubeconfig(AdminToken)
	if err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	d := c.Dir
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kcm, err = startCmd(filepath.Join(Tools(), "kube-controller-manager"), filepath.Join(d, "kube-controller-manager.log"),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[0]),
		"--cert-dir="+filepath.Join(d, "kcm-certs"),
		"--service-account-private-key-file="+filepath.Join(d, "sa.key"),
		"--root-ca-file="+filepath.Join(d, "ca.crt"),
		// Each controller with the controller manager's own credentials:
		// the admin's token, as the test's cluster has no others.
		"--use-service-account-credentials=false",
		// A node that stops reporting is marked in 20 s (default 40 s),
		// so a test sees it within its run.
		"--node-monitor-grace-period=20s",
		"--profiling=false", "--v=1")
	if err != nil {
		return err
	}
	c.sched, err = startCmd(filepath.Join(Tools(), "kube-scheduler"), filepath.Join(d, "kube-scheduler.log"),
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[1]),
		"--cert-dir="+filepath.Join(d, "sched-certs"), "--profiling=false", "--v=1")
	if err != nil {
		return err
	}
	for _, x := range []struct {
		name string
		port int
		p    *proc
	}{{"kube-controller-manager", ports[0], c.kcm}, {"kube-scheduler", ports[1], c.sched}} {
		if err := waitHealthz(x.p, "https://127.0.0.1:"+strconv.Itoa(x.port)+"/healthz", 90*time.Second); err != nil {
			return fmt.Errorf("%s: %w\n%s", x.name, err, tail(filepath.Join(d, x.name+".log")))
		}
	}
	return nil
}

// waitHealthz waits until url answers 200 (its serving certificate is the
// component's own self-signed one: not checked, the port is local).
func waitHealthz(p *proc, url string, limit time.Duration) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return errors.New("exited")
		default:
		}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %s: %s", limit, last)
}

// Stop stops the daemons and removes the directory.
func (c *Cluster) Stop() {
	c.mu.Lock()
	stopCmd(c.sched)
	stopCmd(c.kcm)
	c.sched, c.kcm = nil, nil
	c.mu.Unlock()
	c.StopAPIServer()
	stopCmd(c.etcd)
	c.etcd = nil
	os.RemoveAll(c.Dir)
}

func (c *Cluster) startEtcd() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	cu := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	pu := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cmd, err := startCmd(filepath.Join(Tools(), "etcd"), filepath.Join(c.Dir, "etcd.log"),
		"--data-dir="+filepath.Join(c.Dir, "etcd"), "--name=test",
		"--listen-client-urls="+cu, "--advertise-client-urls="+cu,
		"--listen-peer-urls="+pu, "--initial-advertise-peer-urls="+pu, "--initial-cluster=test="+pu,
		"--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	c.etcd, c.etcdURL = cmd, cu
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(cu + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after 30s: %v\n%s", err, tail(filepath.Join(c.Dir, "etcd.log")))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) waitReady(limit time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-c.apiserve.done:
			return errors.New("exited")
		default:
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, c.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+AdminToken)
		resp, err := hc.Do(req)
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b.String())
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %s", limit, last)
}

// startCmd starts a daemon whose output goes to logPath; it dies with the
// test binary (Pdeathsig), so a killed test leaves no daemon behind.
func startCmd(bin, logPath string, args ...string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

func stopCmd(p *proc) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func freePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// freePorts is n distinct loopback ports free a moment ago. Each listener
// stays open until all n are chosen: closed one by one, the kernel may hand
// the same port out twice (a kubelet was once given one port for two
// listeners and exited at start).
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// writeFiles makes the CA, the serving certificate, the service-account
// signing key and the token file.
func (c *Cluster) writeFiles() error {
	d := c.Dir
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpupin-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	c.CA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost", "kubernetes.default.svc"}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	var tokens strings.Builder
	for tok, u := range c.users {
		// token,user,uid,"group1,group2"
		fmt.Fprintf(&tokens, "%s,%s,%s,\"%s\"\n", tok, u.Name, u.Name, strings.Join(u.Groups, ","))
	}
	files := map[string][]byte{
		"ca.crt":      c.CA,
		"serving.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"serving.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: srvKeyDER}),
		"sa.key":      pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		"tokens.csv":  []byte(tokens.String()),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(d, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// StartT starts a cluster for one test, stopped when it ends, with the
// manifests applied.
func StartT(t testing.TB, manifests []string, users ...User) *Cluster {
	t.Helper()
	skipShort(t)
	c, err := Start(users...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if err := ApplyFiles(context.Background(), c.Admin(), manifests...); err != nil {
		t.Fatal(err)
	}
	return c
}

// skipShort: a cluster is daemons; the fast tier (-short) runs none.
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts etcd and kube-apiserver (make test runs it)")
	}
}
