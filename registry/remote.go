package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/google/go-containerregistry/pkg/authn"
)

// ErrPlainHTTP marks a plain-HTTP request the policy refused.
var ErrPlainHTTP = errors.New("plain HTTP refused")

// Transport is the policy as an http.RoundTripper, for clients that make
// their own registry URLs: go-containerregistry's remote, which publish and
// build read and push through. It keeps them to the rules nodes pull by:
//
//   - each request goes to the endpoint containerd would push to for its
//     host (the registry itself, else hosts.toml's first endpoint with the
//     push capability), over the client containerd's hosts configuration
//     made for it: its CA, client certificates, skip_verify, override_path,
//     and the bounds (on reads; a write may wait for its answer);
//   - a plain-HTTP request is refused unless PlainHTTP allows it for the
//     host or hosts.toml names an http:// endpoint. go-containerregistry
//     on its own falls back to plain HTTP for any RFC 1918 or .local name,
//     which would push where nodes could not pull;
//   - an endpoint that is plain HTTP (a registry named insecure) gets plain
//     HTTP whatever scheme the client tried, as containerd would use.
func (p *Policy) Transport(ctx context.Context) http.RoundTripper {
	return &remoteTransport{policy: p, hosts: p.hosts(ctx, p.updatePushClient), routes: map[string]*route{}}
}

type remoteTransport struct {
	policy *Policy
	hosts  docker.RegistryHosts

	mu     sync.Mutex
	routes map[string]*route // request host → where it goes
}

type route struct {
	host  string // the registry the client named
	ep    docker.RegistryHost
	plain bool // plain HTTP allowed
	err   error
}

func (t *remoteTransport) route(host string) *route {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.routes[host]; ok {
		return r
	}
	r := &route{host: host}
	t.routes[host] = r
	hosts, err := t.hosts(host)
	if err != nil {
		r.err = err
		return r
	}
	r.ep, r.err = pushEndpoint(host, hosts, t.policy.cfg.HostsDir)
	if r.err != nil {
		return r
	}
	r.plain = r.ep.Scheme == "http" || t.policy.PlainHTTP(host)
	// The registry's answers name the endpoint (an upload's Location):
	// those requests go there as the named host's did.
	if _, ok := t.routes[r.ep.Host]; !ok && r.ep.Host != host {
		t.routes[r.ep.Host] = r
	}
	return r
}

// pushEndpoint is the endpoint a push to host goes to: the registry itself
// when it is one of its endpoints, else the first that may be pushed to,
// as containerd's pusher chooses.
func pushEndpoint(host string, hosts []docker.RegistryHost, dir string) (docker.RegistryHost, error) {
	var first *docker.RegistryHost
	for i, h := range hosts {
		if !h.Capabilities.Has(docker.HostCapabilityPush) {
			continue
		}
		if h.Host == host {
			return h, nil
		}
		if first == nil {
			first = &hosts[i]
		}
	}
	if first == nil {
		return docker.RegistryHost{}, fmt.Errorf("registry %s: no endpoint with the push capability in its hosts configuration (%s): give the server, or a host, capabilities [\"pull\", \"resolve\", \"push\"]", host, dir)
	}
	return *first, nil
}

func (t *remoteTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := t.route(req.URL.Host)
	if r.err != nil {
		closeBody(req)
		return nil, r.err
	}
	if req.URL.Scheme == "http" && !r.plain {
		closeBody(req)
		return nil, fmt.Errorf("%s %s: %w to %s: gpupin reaches a registry over plain HTTP only on loopback or when it is named insecure, as containerd does when nodes pull; if %s serves plain HTTP, name it with --insecure-registry %s (or give it a certs.d hosts.toml with server = \"http://%s\")",
			req.Method, req.URL.Redacted(), ErrPlainHTTP, r.host, r.host, r.host, r.host)
	}
	out := req.Clone(req.Context())
	if r.ep.Scheme == "http" {
		out.URL.Scheme = "http"
	}
	if out.URL.Host != r.ep.Host {
		out.URL.Host, out.Host = r.ep.Host, ""
	}
	out.URL.Path, out.URL.RawPath = rebase(out.URL.Path, r.ep.Path), ""
	return r.ep.Client.Transport.RoundTrip(out)
}

// rebase moves a /v2 API path under an endpoint's own root (a path in
// hosts.toml, or override_path's).
func rebase(path, root string) string {
	if root == "" || root == "/v2" || strings.HasPrefix(path, root+"/") {
		return path
	}
	if path == "/v2" || strings.HasPrefix(path, "/v2/") {
		return root + strings.TrimPrefix(path, "/v2")
	}
	return path
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// Keychain is the policy's credentials for go-containerregistry: the
// ones containerd's resolver is given, found the same way, so a refusal
// is explained alike.
func (p *Policy) Keychain() authn.Keychain { return keychain{p} }

type keychain struct{ p *Policy }

func (k keychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	user, secret, err := k.p.credentialsFor(r.RegistryStr())
	if err != nil {
		return nil, err
	}
	switch {
	case user == "" && secret == "":
		return authn.Anonymous, nil
	case user == "":
		return authn.FromConfig(authn.AuthConfig{IdentityToken: secret}), nil
	}
	return authn.FromConfig(authn.AuthConfig{Username: user, Password: secret}), nil
}
