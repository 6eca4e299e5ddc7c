// Package registry is how gpupin reaches registries, for resolving a tag,
// pulling and publishing alike, so that `plan`, `provision` and `publish`
// never disagree on where an image comes from: containerd's hosts
// configuration (certs.d mirrors with their capabilities, CAs, client
// certificates, skip_verify, override_path), plain HTTP only for loopback
// and the registries named insecure, the Docker config's credentials, and
// bounds on every request so a registry that stops answering ends a
// provision instead of holding it.
//
// Call New with a Config. Resolver gives containerd's docker resolver
// (containerd/pull's pulls, images.Resolver's reads); Transport and Keychain give
// go-containerregistry the same hosts and credentials (build's publish);
// Explain turns a registry error into one a person can act on.
package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	ggcrtransport "github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Defaults for the bounds on registry I/O.
const (
	DefaultHeaderTimeout = 30 * time.Second
	DefaultStallTimeout  = 60 * time.Second
	// DefaultStallBytes is the least a transfer must move in a stall
	// window: a byte every few seconds is not a transfer.
	DefaultStallBytes = 32 << 10
)

// Config is the registry policy. The zero value is usable: no certs.d,
// plain HTTP for loopback only, the Docker config's credentials, the
// default bounds.
type Config struct {
	// HostsDir is containerd's certs.d directory (hosts.toml per registry).
	// A missing directory is no mirrors.
	HostsDir string
	// Insecure names registries (host[:port]) reached over plain HTTP.
	Insecure []string
	// Credentials finds credentials for a registry host; nil means the
	// Docker config (DockerCredentials).
	Credentials func(host string) (Credential, error)
	// HeaderTimeout bounds the wait for a response's headers, token
	// endpoints included.
	HeaderTimeout time.Duration
	// StallTimeout and StallBytes: a response body that moves fewer than
	// StallBytes in StallTimeout is cut, with ErrStalled.
	StallTimeout time.Duration
	StallBytes   int64
	// DialContext makes the connections to registries; nil is
	// net.Dialer's. Tests point registry names at loopback with it.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Policy reaches registries as its Config says. It is safe for concurrent use.
type Policy struct {
	cfg      Config
	insecure map[string]bool

	mu    sync.Mutex
	tried map[string][]string // registry host → the endpoints its hosts function gave
	creds map[string]Credential
}

// New makes a Policy.
func New(cfg Config) *Policy {
	if cfg.HeaderTimeout <= 0 {
		cfg.HeaderTimeout = DefaultHeaderTimeout
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.StallBytes <= 0 {
		cfg.StallBytes = DefaultStallBytes
	}
	if cfg.Credentials == nil {
		cfg.Credentials = DockerCredentials
	}
	p := &Policy{cfg: cfg, insecure: map[string]bool{}, tried: map[string][]string{}, creds: map[string]Credential{}}
	for _, h := range cfg.Insecure {
		p.insecure[strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(h, "http://"), "https://"), "/")] = true
	}
	return p
}

// Config returns the policy's configuration, defaults filled in.
func (p *Policy) Config() Config { return p.cfg }

// Resolver is containerd's docker resolver under this policy: the one
// resolution and pulls both go through.
func (p *Policy) Resolver(ctx context.Context) remotes.Resolver {
	return quietResolver{docker.NewResolver(docker.ResolverOptions{Hosts: p.Hosts(ctx)})}
}

// Hosts is containerd's hosts function under this policy.
func (p *Policy) Hosts(ctx context.Context) docker.RegistryHosts {
	return p.hosts(ctx, p.updateClient)
}

// hosts is containerd's hosts function with update putting the bounds on
// each client it makes: the one place certs.d is read, for containerd's
// resolver and for Transport alike.
func (p *Policy) hosts(ctx context.Context, update config.UpdateClientFunc) docker.RegistryHosts {
	base := config.HostOptions{
		Credentials:  p.credentialsFor,
		UpdateClient: update,
	}
	if p.cfg.HostsDir != "" {
		if _, err := os.Stat(p.cfg.HostsDir); err == nil {
			base.HostDir = config.HostDirFromRoot(p.cfg.HostsDir)
		}
	}
	return func(host string) ([]docker.RegistryHost, error) {
		opts := base
		if p.insecure[host] {
			opts.DefaultScheme = "http"
		}
		// Loopback is left to containerd's own rule, as ctr and kubelet see
		// it: HTTPS first (unverified), falling back to plain HTTP.
		hosts, err := config.ConfigureHosts(LogContext(ctx), opts)(host)
		if err != nil {
			return nil, fmt.Errorf("registry %s: hosts configuration in %s: %w", host, p.cfg.HostsDir, err)
		}
		p.remember(host, hosts)
		return hosts, nil
	}
}

// PlainHTTP reports whether a registry may be reached over plain HTTP:
// those named insecure (plain HTTP only), and loopback ones (HTTPS tried
// first, as containerd does for localhost). Nothing else is guessed from
// an address; a mirror says its own scheme in hosts.toml. Transport
// refuses a plain-HTTP request by this rule.
func (p *Policy) PlainHTTP(host string) bool {
	return p.insecure[host] || isLoopback(host)
}

func (p *Policy) remember(host string, hosts []docker.RegistryHost) {
	var eps []string
	for _, h := range hosts {
		var caps []string
		if h.Capabilities.Has(docker.HostCapabilityResolve) {
			caps = append(caps, "resolve")
		}
		if h.Capabilities.Has(docker.HostCapabilityPull) {
			caps = append(caps, "pull")
		}
		if h.Capabilities.Has(docker.HostCapabilityPush) {
			caps = append(caps, "push")
		}
		eps = append(eps, fmt.Sprintf("%s://%s%s (%s)", h.Scheme, h.Host, h.Path, strings.Join(caps, ", ")))
	}
	p.mu.Lock()
	p.tried[host] = eps
	p.mu.Unlock()
}

// updateClient puts the bounds on every client the hosts function makes
// (one per endpoint, the token endpoint's included).
func (p *Policy) updateClient(c *http.Client) error {
	if t, ok := c.Transport.(*http.Transport); ok {
		if p.cfg.DialContext != nil {
			t.DialContext = p.cfg.DialContext
		}
		t.ResponseHeaderTimeout = p.cfg.HeaderTimeout
	}
	c.Transport = &boundedTransport{next: c.Transport, policy: p}
	return nil
}

// updatePushClient is updateClient for Transport's clients, which push:
// the bounds hold for reads, but a write's answer waits for the registry
// to take in what was sent (a large blob is hashed, or copied to object
// storage, before the registry answers), so writes go through a transport
// without the header timeout.
func (p *Policy) updatePushClient(c *http.Client) error {
	t, ok := c.Transport.(*http.Transport)
	if err := p.updateClient(c); err != nil || !ok {
		return err
	}
	w := t.Clone()
	w.ResponseHeaderTimeout = 0
	c.Transport.(*boundedTransport).writes = w
	return nil
}

func isLoopback(host string) bool {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Explain adds to an error from resolving or pulling ref what a person
// needs to act on it: the endpoints that were tried, and on a refusal
// whether credentials were found, where, and that they were refused.
func (p *Policy) Explain(err error, host string) error {
	if err == nil {
		return nil
	}
	p.mu.Lock()
	eps := p.tried[host]
	cred, credKnown := p.creds[host]
	p.mu.Unlock()
	var notes []string
	if unauthorized(err) {
		if !credKnown {
			cred, _ = p.cfg.Credentials(host)
		}
		switch {
		case cred.User != "" || cred.Secret != "":
			notes = append(notes, fmt.Sprintf("credentials for %s were found in %s and refused by the registry: check them (docker login %s)", host, cred.Source, host))
		default:
			where := cred.Source
			if where == "" {
				where = "the Docker config"
			}
			notes = append(notes, fmt.Sprintf("the registry asks for credentials and none were found for %s (looked in %s): docker login %s, or configure a credential helper", host, where, host))
		}
	}
	if errors.Is(err, ErrStalled) {
		notes = append(notes, "the registry stopped sending; gpupin gave up rather than wait for ever")
	}
	// Where it looked matters when it found nothing there; a transfer cut
	// half-way says enough by itself.
	if len(eps) > 1 || (len(eps) == 1 && unreachable(err)) {
		tried := "tried " + strings.Join(eps, ", ")
		if isLoopback(host) && !p.insecure[host] {
			tried += " (HTTPS first, then plain HTTP, as containerd does for loopback)"
		}
		notes = append(notes, tried)
	}
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(notes, "; "))
}

func unauthorized(err error) bool {
	if errors.Is(err, docker.ErrInvalidAuthorization) {
		return true
	}
	var st remoteerrors.ErrUnexpectedStatus
	if errors.As(err, &st) && st.StatusCode == http.StatusUnauthorized {
		return true
	}
	// go-containerregistry's, through Transport.
	var te *ggcrtransport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusUnauthorized
}

func (p *Policy) credentialsFor(host string) (string, string, error) {
	c, err := p.cfg.Credentials(host)
	if err != nil {
		return "", "", fmt.Errorf("credentials for %s: %w", host, err)
	}
	p.mu.Lock()
	p.creds[host] = c
	p.mu.Unlock()
	return c.User, c.Secret, nil
}

// unreachable reports an error of finding the registry or the name at all:
// no connection, no such host, a certificate, nothing under that name.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) || errdefs.IsNotFound(err) || unauthorized(err) {
		return true
	}
	s := err.Error()
	for _, m := range []string{"no such host", "connection refused", "certificate", "tls:", "server gave HTTP response"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}
