package testenv

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/gpupin/gpupin/internal/sandbox"
)

// Distribution starts Debian's docker-registry (CNCF distribution 2.8) for
// one test. It needs no root; a missing docker-registry fails the test
// (scripts/deps.sh installs it), it never skips.
func Distribution(t testing.TB, opts sandbox.DistributionOptions) *sandbox.Distribution {
	t.Helper()
	Daemons(t)
	d, err := sandbox.StartDistribution(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// TLSDistribution starts docker-registry serving HTTPS with a certificate
// for 127.0.0.1 from a CA made for the test (opts' CertFile and KeyFile are
// set here). Clients trust it through ca.Pool() (go-containerregistry:
// d.Remote(ca.Pool())) or ca.CertFile (the `ca` of a containerd hosts.toml).
func TLSDistribution(t testing.TB, opts sandbox.DistributionOptions) (*sandbox.Distribution, *sandbox.CA) {
	t.Helper()
	Daemons(t)
	ca := CA(t)
	kp, err := ca.Server("registry")
	if err != nil {
		t.Fatal(err)
	}
	opts.CertFile, opts.KeyFile = kp.CertFile, kp.KeyFile
	return Distribution(t, opts), ca
}

// Reg is one registry a table-driven test runs against.
type Reg struct {
	// Name is "ggcr" (go-containerregistry's registry, in process) or
	// "distribution" (Debian's docker-registry): a subtest name.
	Name string
	Host string // 127.0.0.1:port, plain HTTP (TLS from TLSRegistries), no auth
	// TLS says it serves HTTPS (TLSRegistries).
	TLS bool
	// InProcess is the in-process registry, which counts requests and
	// takes hooks; nil for docker-registry.
	InProcess *sandbox.Registry
}

// Registries starts one registry of each implementation for one test, so
// the test can run the same steps against both:
//
//	for _, reg := range testenv.Registries(t) {
//		t.Run(reg.Name, func(t *testing.T) { … reg.Host … })
//	}
func Registries(t testing.TB) []Reg {
	t.Helper()
	in := Registry(t)
	d := Distribution(t, sandbox.DistributionOptions{})
	return []Reg{
		{Name: "ggcr", Host: in.Host, InProcess: in},
		{Name: "distribution", Host: d.Host},
	}
}

// CA makes a certificate authority for one test, its files in a temporary
// directory of the test's.
func CA(t testing.TB) *sandbox.CA {
	t.Helper()
	ca, err := sandbox.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// ToolsDir is where scripts/deps.sh caches the tools the tests need that
// Debian does not package (containerd 2.x, crictl, staticcheck); the
// GPUPIN_TOOLS variable moves it, as it does for deps.sh.
func ToolsDir() string {
	if d := os.Getenv("GPUPIN_TOOLS"); d != "" {
		return d
	}
	return "/var/tmp/gpupin-tools"
}

// Crictl is the path of crictl: from PATH, else from ToolsDir. Missing, it
// fails the test (scripts/deps.sh builds it).
func Crictl(t testing.TB) string {
	t.Helper()
	Daemons(t)
	if p, err := exec.LookPath("crictl"); err == nil {
		return p
	}
	p := filepath.Join(ToolsDir(), "crictl")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("crictl is not installed (scripts/deps.sh builds it into %s): %v", ToolsDir(), err)
	}
	return p
}

// DeleteBlob removes a blob from a plain-HTTP loopback registry (both
// implementations allow it), and checks that readers no longer get it.
func DeleteBlob(t testing.TB, host, repo, digest string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, "http://"+host+"/v2/"+repo+"/blobs/"+digest, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		t.Fatalf("delete %s: %s", digest, resp.Status)
	}
	// Gone for readers too, not only unlinked.
	get, err := http.Get("http://" + host + "/v2/" + repo + "/blobs/" + digest)
	if err != nil {
		t.Fatal(err)
	}
	get.Body.Close()
	if get.StatusCode != http.StatusNotFound {
		t.Fatalf("blob %s after delete: %s", digest, get.Status)
	}
}

// MustRef parses a reference as go-containerregistry does, or fails the test.
func MustRef(t testing.TB, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
