package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
)

// Distribution is Debian's docker-registry (CNCF distribution 2.8) on
// loopback: a second, independent registry implementation, with a
// filesystem store, basic auth and TLS as deployments run it. Unlike
// Registry it cannot count requests or inject faults; tests that need
// those use Registry.
type Distribution struct {
	Host string // 127.0.0.1:port
	Dir  string // config.yml, htpasswd, data/, registry.log

	// User and Password are the one account htpasswd auth admits ("" when
	// auth is off).
	User, Password string
	// TLS says the registry serves HTTPS (DistributionOptions.CertFile).
	TLS bool

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// DistributionOptions tunes docker-registry.
type DistributionOptions struct {
	// Bin is the registry binary; default docker-registry from PATH.
	Bin string
	// User and Password turn on htpasswd (basic) auth for this one user.
	User, Password string
	// CertFile and KeyFile (PEM) turn on TLS; see NewCA for a test CA.
	CertFile, KeyFile string
	// ClientCAs (PEM files) make the registry ask for a client certificate
	// signed by one of them and refuse connections without one (TLS only).
	ClientCAs []string
}

// StartDistribution runs `docker-registry serve` on a free loopback port
// with its store in a new temporary directory, and waits until /v2/
// answers. Close stops it and removes the directory.
func StartDistribution(ctx context.Context, opts DistributionOptions) (*Distribution, error) {
	bin := opts.Bin
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("docker-registry"); err != nil {
			return nil, fmt.Errorf("docker-registry is not installed (apt-get install docker-registry; scripts/deps.sh does): %w", err)
		}
	}
	if (opts.CertFile == "") != (opts.KeyFile == "") {
		return nil, errors.New("docker-registry: TLS needs both CertFile and KeyFile")
	}
	if len(opts.ClientCAs) > 0 && opts.CertFile == "" {
		return nil, errors.New("docker-registry: ClientCAs need TLS (CertFile and KeyFile)")
	}
	if opts.Password != "" && opts.User == "" {
		return nil, errors.New("docker-registry: a Password needs a User")
	}
	dir, err := os.MkdirTemp("", "gpupin-distribution-")
	if err != nil {
		return nil, err
	}
	d := &Distribution{Dir: dir, User: opts.User, Password: opts.Password, TLS: opts.CertFile != ""}
	if opts.User != "" {
		// bcrypt is the only hash distribution's htpasswd accepts. The
		// registry checks the hash on every request, so the cheapest cost
		// keeps a pull of many blobs from spending seconds in bcrypt.
		hash, err := bcrypt.GenerateFromPassword([]byte(opts.Password), bcrypt.MinCost)
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("htpasswd: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "htpasswd"), fmt.Appendf(nil, "%s:%s\n", opts.User, hash), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	// The port is chosen free and then handed over, so another process may
	// take it in between: start again on a new one when that happens.
	for attempt := 0; ; attempt++ {
		err = d.start(ctx, bin, opts)
		if err == nil {
			return d, nil
		}
		d.stop()
		if attempt == 4 || !strings.Contains(err.Error(), "address already in use") {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func (d *Distribution) start(ctx context.Context, bin string, opts DistributionOptions) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	d.Host = ln.Addr().String()
	ln.Close()
	cfg := filepath.Join(d.Dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(d.config(opts)), 0o600); err != nil {
		return fmt.Errorf("write docker-registry config: %w", err)
	}
	logf, err := os.Create(filepath.Join(d.Dir, "registry.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	// REGISTRY_* variables override the config file: none from the
	// caller's environment may change the registry under test.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REGISTRY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start docker-registry: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	d.mu.Lock()
	d.cmd, d.exited = cmd, exited
	d.mu.Unlock()

	// Ready when /v2/ answers: 200, or 401 with auth on. The check skips
	// certificate verification: it asks whether the server is up, not
	// whether a client trusts it.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // only the readiness probe
		Proxy:           nil,
	}}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("docker-registry exited at start: %s", d.LogTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if len(opts.ClientCAs) > 0 {
			// Without a client certificate the handshake fails: a
			// listening port is the most the probe can see.
			if conn, err := net.Dial("tcp", d.Host); err == nil {
				conn.Close()
				return nil
			}
			continue
		}
		resp, err := client.Get(d.URL() + "/v2/")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
			return nil
		}
		return fmt.Errorf("docker-registry: GET /v2/: %s: %s", resp.Status, d.LogTail())
	}
	return fmt.Errorf("docker-registry did not answer on %s in 20s: %s", d.Host, d.LogTail())
}

// config is distribution's YAML configuration. JSON strings are valid YAML
// scalars, so paths are written with %q.
func (d *Distribution) config(opts DistributionOptions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n")
	// Uploads are never purged in the background (the default purges
	// week-old ones every day, starting at a random time).
	fmt.Fprintf(&b, "storage:\n  filesystem:\n    rootdirectory: %q\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false\n", filepath.Join(d.Dir, "data"))
	fmt.Fprintf(&b, "http:\n  addr: %q\n  secret: %q\n", d.Host, rand.Text())
	if opts.CertFile != "" {
		fmt.Fprintf(&b, "  tls:\n    certificate: %q\n    key: %q\n", abs(opts.CertFile), abs(opts.KeyFile))
		if len(opts.ClientCAs) > 0 {
			fmt.Fprintf(&b, "    clientcas:\n")
			for _, ca := range opts.ClientCAs {
				fmt.Fprintf(&b, "      - %q\n", abs(ca))
			}
		}
	}
	if opts.User != "" {
		fmt.Fprintf(&b, "auth:\n  htpasswd:\n    realm: gpupin-test\n    path: %q\n", filepath.Join(d.Dir, "htpasswd"))
	}
	// A failing health check turns every request into a 503; a test
	// registry's store is a local directory, with nothing to watch.
	fmt.Fprintf(&b, "health:\n  storagedriver:\n    enabled: false\n")
	return b.String()
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// URL is the registry's base URL, https when it serves TLS.
func (d *Distribution) URL() string {
	if d.TLS {
		return "https://" + d.Host
	}
	return "http://" + d.Host
}

// Remote is what go-containerregistry's remote needs to reach this
// registry as a client that holds its credentials and trusts roots (the
// test CA's Pool; nil: the system's).
func (d *Distribution) Remote(roots *x509.CertPool) []remote.Option {
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	opts := []remote.Option{remote.WithTransport(tr)}
	if d.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: d.User, Password: d.Password}))
	}
	return opts
}

// LogTail returns the end of the registry's log.
func (d *Distribution) LogTail() string {
	data, _ := os.ReadFile(filepath.Join(d.Dir, "registry.log"))
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(bytes.TrimSpace(data))
}

func (d *Distribution) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil && d.cmd.Process != nil {
		// A test registry keeps nothing worth a graceful drain.
		d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
}

// Close stops the registry and removes its directory.
func (d *Distribution) Close() error {
	d.stop()
	if err := os.RemoveAll(d.Dir); err != nil {
		return fmt.Errorf("remove docker-registry dir: %w", err)
	}
	return nil
}
