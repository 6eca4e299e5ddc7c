package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"
)

// DefaultHostsDir is the directory containerd's hosts configuration
// names, the one the CRI plugin reads (config_path).
const DefaultHostsDir = "/etc/containerd/certs.d"

// Mirrors is what containerd's hosts configuration says about one
// registry: the hosts it tries before the registry itself. A
// peer-to-peer mirror (Spegel) is configured so, first in the list.
type Mirrors struct {
	// Registry is the registry host, or "_default" for the file that
	// counts for every registry without a directory of its own.
	Registry string `json:"registry"`
	// File is the hosts.toml read; "" when there is none for the registry.
	File string `json:"file,omitempty"`
	// Hosts are the mirrors that pull, in order (scheme://host[/path]);
	// the registry's own server, last in containerd's list, is not one.
	Hosts []string `json:"mirrors,omitempty"`
}

// Mirrored reports whether a mirror is named.
func (m Mirrors) Mirrored() bool { return len(m.Hosts) > 0 }

// Mirrors reads the hosts configuration of registry (host[:port]) as
// containerd does: HOSTSDIR/<host>/hosts.toml, else
// HOSTSDIR/_default/hosts.toml. No hosts directory, or no file for the
// registry, is no mirror.
func (p *Policy) Mirrors(ctx context.Context, registry string) (Mirrors, error) {
	m := Mirrors{Registry: registry}
	if p.cfg.HostsDir == "" {
		return m, nil
	}
	dir, err := config.HostDirFromRoot(p.cfg.HostsDir)(registry)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("hosts configuration of %s in %s: %w", registry, p.cfg.HostsDir, err)
	}
	m.File = filepath.Join(dir, "hosts.toml")
	hosts, err := config.ConfigureHosts(LogContext(ctx), config.HostOptions{
		HostDir: func(string) (string, error) { return dir, nil },
	})(registry)
	if err != nil {
		return m, fmt.Errorf("hosts configuration of %s in %s: %w", registry, dir, err)
	}
	// containerd puts the registry's own server last; every host before
	// it is tried first: a mirror.
	for i, h := range hosts {
		// A file may name the registry itself among its hosts as well.
		if i == len(hosts)-1 || !h.Capabilities.Has(docker.HostCapabilityPull) || h.Host == hosts[len(hosts)-1].Host || h.Host == registry {
			continue
		}
		m.Hosts = append(m.Hosts, h.Scheme+"://"+h.Host+strings.TrimSuffix(h.Path, "/v2"))
	}
	return m, nil
}

// MirrorConfigs lists the registries (and _default) whose hosts
// configuration names a mirror, for a person to read: `gpupin detect`.
func (p *Policy) MirrorConfigs(ctx context.Context) ([]Mirrors, error) {
	if p.cfg.HostsDir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(p.cfg.HostsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hosts configuration in %s: %w", p.cfg.HostsDir, err)
	}
	var out []Mirrors
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		host := hostOfDir(e.Name())
		m, err := p.Mirrors(ctx, host)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// A registry without a file of its own reads _default's: listed once.
		if m.Mirrored() && (host == "_default" || filepath.Base(filepath.Dir(m.File)) != "_default") {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Registry < out[j].Registry })
	return out, errors.Join(errs...)
}

// hostOfDir is the registry host a certs.d directory stands for:
// containerd writes host:port as host_port_.
func hostOfDir(name string) string {
	if rest, ok := strings.CutSuffix(name, "_"); ok {
		if i := strings.LastIndex(rest, "_"); i > 0 {
			return rest[:i] + ":" + rest[i+1:]
		}
	}
	return name
}
