package sandbox

import (
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/registry"
)

// Registry is go-containerregistry's registry on loopback, counting the
// requests it serves so tests can assert what a command fetched.
type Registry struct {
	Host string // 127.0.0.1:port

	srv     *http.Server
	ln      net.Listener
	down    atomic.Bool
	mu      sync.Mutex
	reqs    []Request
	handler http.Handler
	// Hook, when set, sees each request first; returning true means it answered.
	Hook func(w http.ResponseWriter, r *http.Request) bool
}

// Request is one request the registry saw.
type Request struct {
	Method string
	Path   string
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
}

// StartRegistry serves a registry on 127.0.0.1 on a free port.
func StartRegistry(opts RegistryOptions) (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ropts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if opts.BlobDir != "" {
		ropts = append(ropts, registry.WithBlobHandler(registry.NewDiskBlobHandler(opts.BlobDir)))
	}
	r := &Registry{Host: ln.Addr().String(), ln: ln, handler: registry.New(ropts...)}
	r.srv = &http.Server{Handler: r}
	go r.srv.Serve(ln)
	return r, nil
}

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.reqs = append(r.reqs, Request{Method: req.Method, Path: req.URL.Path})
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
	if hook != nil && hook(w, req) {
		return
	}
	r.handler.ServeHTTP(w, req)
}

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
	r.mu.Unlock()
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
