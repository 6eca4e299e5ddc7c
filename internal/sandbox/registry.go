package sandbox

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/registry"
)

// Registry is go-containerregistry's registry on loopback, counting the
// requests it serves so tests can assert what a command fetched.
type Registry struct {
	Host string // 127.0.0.1:port
	// TLS says the registry serves HTTPS (RegistryOptions.CertFile).
	TLS bool

	srv     *http.Server
	ln      net.Listener
	down    atomic.Bool
	mu      sync.Mutex
	reqs    []Request
	gen     int // bumped by Reset
	handler http.Handler
	// Hook, when set, sees each request first; returning true means it answered.
	Hook func(w http.ResponseWriter, r *http.Request) bool
}

// Request is one request the registry saw.
type Request struct {
	Method string
	Path   string
	// Bytes is the size of the response body written so far (a hook's
	// answer too), so tests can tell what a pull really fetched.
	Bytes int64
}

// Kind classifies a request: "manifest", "blob", "upload", "tags", "other".
func (r Request) Kind() string {
	switch {
	case strings.Contains(r.Path, "/manifests/"):
		return "manifest"
	case strings.Contains(r.Path, "/blobs/uploads"):
		return "upload"
	case strings.Contains(r.Path, "/blobs/"):
		return "blob"
	case strings.Contains(r.Path, "/tags/"):
		return "tags"
	}
	return "other"
}

// RegistryOptions tunes the registry.
type RegistryOptions struct {
	// BlobDir keeps blobs on disk instead of in memory (benchmarks).
	BlobDir string
	// CertFile and KeyFile (PEM) turn on TLS; see NewCA for a test CA.
	CertFile, KeyFile string
	// ClientCAs (PEM files) make the registry ask for a client certificate
	// signed by one of them and refuse connections without one (TLS only).
	ClientCAs []string
}

// StartRegistry serves a registry on 127.0.0.1 on a free port.
func StartRegistry(opts RegistryOptions) (*Registry, error) {
	tlsConf, err := serverTLS(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ropts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if opts.BlobDir != "" {
		ropts = append(ropts, registry.WithBlobHandler(registry.NewDiskBlobHandler(opts.BlobDir)))
	}
	r := &Registry{Host: ln.Addr().String(), ln: ln, handler: registry.New(ropts...), TLS: tlsConf != nil}
	// The handshake errors of clients a test expects to fail are not news.
	r.srv = &http.Server{Handler: r, TLSConfig: tlsConf, ErrorLog: log.New(io.Discard, "", 0)}
	if tlsConf != nil {
		go r.srv.Serve(tls.NewListener(ln, tlsConf))
	} else {
		go r.srv.Serve(ln)
	}
	return r, nil
}

// serverTLS is the TLS configuration opts ask for; nil for plain HTTP.
func serverTLS(opts RegistryOptions) (*tls.Config, error) {
	if opts.CertFile == "" && opts.KeyFile == "" {
		if len(opts.ClientCAs) > 0 {
			return nil, errors.New("registry: ClientCAs need TLS (CertFile and KeyFile)")
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("registry: TLS key pair: %w", err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}}
	if len(opts.ClientCAs) > 0 {
		pool := x509.NewCertPool()
		for _, f := range opts.ClientCAs {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("registry: client CA: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("registry: client CA %s: no certificate", f)
			}
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// URL is the registry's base URL, https when it serves TLS.
func (r *Registry) URL() string {
	if r.TLS {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.reqs = append(r.reqs, Request{Method: req.Method, Path: req.URL.Path})
	idx, gen := len(r.reqs)-1, r.gen
	hook := r.Hook
	r.mu.Unlock()
	if r.down.Load() {
		// A registry that is down: the connection drops without an answer.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	cw := &countingWriter{ResponseWriter: w, reg: r, idx: idx, gen: gen}
	if hook != nil && hook(cw, req) {
		return
	}
	r.handler.ServeHTTP(cw, r.closeRange(req))
}

// closeRange turns an open-ended blob range (bytes=N-, what containerd
// sends to resume a download) into the closed one go-containerregistry's
// registry understands; registries in production take both.
func (r *Registry) closeRange(req *http.Request) *http.Request {
	rng := req.Header.Get("Range")
	if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/blobs/sha256:") ||
		!strings.HasPrefix(rng, "bytes=") || !strings.HasSuffix(rng, "-") || strings.Contains(rng, ",") {
		return req
	}
	head := httptest.NewRecorder()
	hreq := req.Clone(req.Context())
	hreq.Method = http.MethodHead
	hreq.Header.Del("Range")
	r.handler.ServeHTTP(head, hreq)
	size, err := strconv.ParseInt(head.Header().Get("Content-Length"), 10, 64)
	if head.Code != http.StatusOK || err != nil || size == 0 {
		return req
	}
	out := req.Clone(req.Context())
	out.Header.Set("Range", fmt.Sprintf("%s%d", rng, size-1))
	return out
}

// countingWriter adds what is written to the request's Bytes. It keeps
// Flush and Hijack reachable: hooks stream and cut connections.
type countingWriter struct {
	http.ResponseWriter
	reg *Registry
	idx int
	gen int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.reg.mu.Lock()
	// A Reset in between starts a new log: this request is not in it.
	if c.reg.gen == c.gen && c.idx < len(c.reg.reqs) {
		c.reg.reqs[c.idx].Bytes += int64(n)
	}
	c.reg.mu.Unlock()
	return n, err
}

func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (c *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := c.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("response writer cannot be hijacked")
	}
	return hj.Hijack()
}

// Unwrap lets http.ResponseController reach the connection.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// SetDown makes every request fail (true) or be served again (false).
func (r *Registry) SetDown(down bool) { r.down.Store(down) }

// SetHook installs a request hook (nil removes it).
func (r *Registry) SetHook(h func(w http.ResponseWriter, r *http.Request) bool) {
	r.mu.Lock()
	r.Hook = h
	r.mu.Unlock()
}

// Requests returns the requests seen so far.
func (r *Registry) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Request(nil), r.reqs...)
}

// Reset forgets the requests seen so far.
func (r *Registry) Reset() {
	r.mu.Lock()
	r.reqs = nil
	r.gen++
	r.mu.Unlock()
}

// BytesServed sums the response bytes of requests of one kind ("" = all)
// and method ("" = any) since the last Reset.
func (r *Registry) BytesServed(kind, method string) int64 {
	var n int64
	for _, q := range r.Requests() {
		if (kind == "" || q.Kind() == kind) && (method == "" || q.Method == method) {
			n += q.Bytes
		}
	}
	return n
}

// Count counts requests of one kind ("blob", "manifest", …) and method ("" = any).
func (r *Registry) Count(kind, method string) int {
	n := 0
	for _, q := range r.Requests() {
		if q.Kind() == kind && (method == "" || q.Method == method) {
			n++
		}
	}
	return n
}

// Close stops serving.
func (r *Registry) Close() error { return r.srv.Close() }
