package registry_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpupin/gpupin/registry"
)

func writeHosts(t *testing.T, root, dir, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, dir, "hosts.toml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// What containerd's hosts configuration names as mirrors, read as
// containerd reads it: the registry's own directory first, then _default;
// the registry's server (last in containerd's list) is no mirror, nor a
// host that may only resolve.
func TestMirrors(t *testing.T) {
	root := t.TempDir()
	writeHosts(t, root, "registry.example", `server = "https://registry.example"

[host."http://127.0.0.1:30020"]
  capabilities = ["pull", "resolve"]
[host."https://registry.example"]
  capabilities = ["pull", "resolve"]
`)
	writeHosts(t, root, "plain.example", `server = "https://plain.example"`)
	writeHosts(t, root, "resolver.example", `server = "https://resolver.example"
[host."https://tags.example"]
  capabilities = ["resolve"]
`)
	writeHosts(t, root, "localhost_5000_", `[host."http://127.0.0.1:30021/v2/proxy"]
  capabilities = ["pull"]
  override_path = true
`)
	withDefault := t.TempDir()
	writeHosts(t, withDefault, "_default", `[host."http://127.0.0.1:30020"]
  capabilities = ["pull", "resolve"]
`)
	writeHosts(t, withDefault, "own.example", `server = "https://own.example"`)
	tests := []struct {
		root, registry string
		want           []string
		file           string // the directory read, under root
	}{
		{root, "registry.example", []string{"http://127.0.0.1:30020"}, "registry.example"},
		{root, "plain.example", nil, "plain.example"},
		{root, "resolver.example", nil, "resolver.example"},
		{root, "localhost:5000", []string{"http://127.0.0.1:30021/v2/proxy"}, "localhost_5000_"},
		{root, "other.example", nil, ""},
		{withDefault, "other.example", []string{"http://127.0.0.1:30020"}, "_default"},
		{withDefault, "own.example", nil, "own.example"},
		{filepath.Join(root, "missing"), "registry.example", nil, ""},
		{"", "registry.example", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.registry+" in "+filepath.Base(tc.root), func(t *testing.T) {
			m, err := registry.New(registry.Config{HostsDir: tc.root}).Mirrors(context.Background(), tc.registry)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.Hosts, tc.want) || m.Mirrored() != (len(tc.want) > 0) {
				t.Errorf("mirrors %v, want %v", m.Hosts, tc.want)
			}
			wantFile := ""
			if tc.file != "" {
				wantFile = filepath.Join(tc.root, tc.file, "hosts.toml")
			}
			if m.File != wantFile {
				t.Errorf("file %q, want %q", m.File, wantFile)
			}
		})
	}
	list, err := registry.New(registry.Config{HostsDir: root}).MirrorConfigs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list {
		names = append(names, m.Registry)
	}
	if !slices.Equal(names, []string{"localhost:5000", "registry.example"}) {
		t.Errorf("MirrorConfigs lists %v, want the two registries with a mirror", names)
	}
	list, _ = registry.New(registry.Config{HostsDir: withDefault}).MirrorConfigs(context.Background())
	if len(list) != 1 || list[0].Registry != "_default" {
		t.Errorf("MirrorConfigs with _default lists %+v, want _default alone", list)
	}
}
