package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpupin/gpupin/internal/sandbox"
)

// HostsToml writes DIR/HOST/hosts.toml, containerd's certs.d layout, and
// returns DIR; dir "" makes a new one for the test.
func HostsToml(t testing.TB, dir, host, body string) string {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Dialer connects registry names a test makes up (a private address, a
// .local name) to real registries on loopback, so a registry can be
// reached under a name the plain-HTTP rule treats as remote. It records
// the first byte every connection sends: a TLS handshake (0x16) or a
// plain-HTTP request. Use DialContext as registry.Config's.
type Dialer struct {
	// Routes maps host:port, as a client dials it, to a loopback address.
	Routes map[string]string

	mu    sync.Mutex
	dials []Dial
}

// Dial is one connection a Dialer made.
type Dial struct {
	Addr  string // as dialled
	first []byte
}

// TLS reports whether the connection began with a TLS handshake.
func (d Dial) TLS() bool { return len(d.first) > 0 && d.first[0] == 0x16 }

// PlainHTTP reports whether the connection began with a plain-HTTP request.
func (d Dial) PlainHTTP() bool { return len(d.first) > 0 && d.first[0] >= 'A' && d.first[0] <= 'Z' }

// DialContext dials addr, or where Routes sends it.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	to := addr
	if r, ok := d.Routes[addr]; ok {
		to = r
	}
	// Recorded before dialling: an attempt counts, answered or not.
	d.mu.Lock()
	d.dials = append(d.dials, Dial{Addr: addr})
	i := len(d.dials) - 1
	d.mu.Unlock()
	c, err := (&net.Dialer{}).DialContext(ctx, network, to)
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, d: d, i: i}, nil
}

// Dials returns the connections made (or tried) so far.
func (d *Dialer) Dials() []Dial {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Dial(nil), d.dials...)
}

type recordingConn struct {
	net.Conn
	d    *Dialer
	i    int
	once sync.Once
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.once.Do(func() {
		c.d.mu.Lock()
		c.d.dials[c.i].first = append([]byte(nil), p[:min(len(p), 8)]...)
		c.d.mu.Unlock()
	})
	return c.Conn.Write(p)
}

// tlsServers numbers the certificates TLSRegistries issues, so two calls
// with one CA do not write the same files.
var tlsServers atomic.Int64

// TLSOptions say what the registries of TLSRegistries serve.
type TLSOptions struct {
	// Names the server certificate is for; default 127.0.0.1, ::1 and
	// localhost.
	Names []string
	// ClientCAs make the registries refuse a client without a certificate
	// signed by one of them.
	ClientCAs []string
}

// TLSRegistries starts one registry of each implementation serving HTTPS
// with a certificate from ca, as Registries does for plain HTTP. Put
// content in with ca.Remote (and the client's KeyPair when ClientCAs are
// set).
func TLSRegistries(t testing.TB, ca *sandbox.CA, opts TLSOptions) []Reg {
	t.Helper()
	kp, err := ca.Server(fmt.Sprintf("registry-%d", tlsServers.Add(1)), opts.Names...)
	if err != nil {
		t.Fatal(err)
	}
	in, err := sandbox.StartRegistry(sandbox.RegistryOptions{CertFile: kp.CertFile, KeyFile: kp.KeyFile, ClientCAs: opts.ClientCAs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	d := Distribution(t, sandbox.DistributionOptions{CertFile: kp.CertFile, KeyFile: kp.KeyFile, ClientCAs: opts.ClientCAs})
	return []Reg{
		{Name: "ggcr", Host: in.Host, InProcess: in, TLS: true},
		{Name: "distribution", Host: d.Host, TLS: true},
	}
}
