package runtime

import (
	"context"
	"net"
	"os"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// resolver builds containerd's docker resolver: mirrors and TLS from the
// certs.d directory, credentials from the Docker config, plain HTTP for
// loopback and the registries named insecure.
func (r *Runtime) resolver(ctx context.Context) remotes.Resolver {
	insecure := map[string]bool{}
	for _, h := range r.insecure {
		insecure[h] = true
	}
	base := config.HostOptions{Credentials: dockerCredentials}
	if r.hostsDir != "" {
		if _, err := os.Stat(r.hostsDir); err == nil {
			base.HostDir = config.HostDirFromRoot(r.hostsDir)
		}
	}
	hosts := func(host string) ([]docker.RegistryHost, error) {
		opts := base
		if insecure[host] || isLoopback(host) {
			opts.DefaultScheme = "http"
		}
		return config.ConfigureHosts(ctx, opts)(host)
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: hosts})
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

// dockerCredentials reads ~/.docker/config.json (and credential helpers)
// through go-containerregistry's keychain, the same one `plan` uses.
func dockerCredentials(host string) (string, string, error) {
	reg, err := name.NewRegistry(host)
	if err != nil {
		return "", "", nil
	}
	a, err := authn.DefaultKeychain.Resolve(reg)
	if err != nil || a == authn.Anonymous {
		return "", "", nil
	}
	cfg, err := a.Authorization()
	if err != nil {
		return "", "", err
	}
	if cfg.IdentityToken != "" {
		return "", cfg.IdentityToken, nil
	}
	return cfg.Username, cfg.Password, nil
}
