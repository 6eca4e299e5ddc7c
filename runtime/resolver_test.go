package runtime_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/runtime"
)

// A registry name that resolves nowhere is pulled through the mirror that
// containerd's certs.d directory names for it.
func TestPullThroughCertsDMirror(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	ref := pushed(t, reg, "FROM_MIRROR=1")
	digest := ref[strings.Index(ref, "@")+1:]

	hostsDir := t.TempDir()
	const name = "registry.gpupin.invalid"
	os.MkdirAll(filepath.Join(hostsDir, name), 0o755)
	hostsToml := fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", name, reg.Host)
	if err := os.WriteFile(filepath.Join(hostsDir, name, "hosts.toml"), []byte(hostsToml), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := testenv.Runtime(t, runtime.WithRegistry(registry.New(registry.Config{HostsDir: hostsDir})))
	reg.Reset()
	p, err := rt.Pull(ctx, name+"/eng@"+digest, runtime.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Digest != digest {
		t.Fatalf("pulled %s, want %s", p.Digest, digest)
	}
	if n := reg.Count("manifest", ""); n == 0 {
		t.Fatal("the mirror saw no request")
	}
}
