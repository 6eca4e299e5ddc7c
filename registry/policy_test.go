package registry_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/registry"
)

var cu129 = testenv.CU129

// hostsToml writes DIR/HOST/hosts.toml and returns DIR.
func hostsToml(t *testing.T, dir, host, body string) string {
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

// A name no DNS knows is resolved through the mirror containerd's certs.d
// names for it; the variants keep the upstream name, which is what pins
// are named by.
func TestResolveThroughCertsDMirror(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}
	const upstream = "registry.gpupin.invalid"
	dir := hostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", upstream, reg.Host))
	reg.Reset()
	r := images.Resolver{Remote: registry.New(registry.Config{HostsDir: dir})}
	set, err := r.Resolve(ctx, upstream+"/demo:1.0")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Variants) != 1 || !strings.HasPrefix(set.Variants[0].Ref, upstream+"/demo@sha256:") {
		t.Fatalf("variants %+v: want the upstream name", set.Variants)
	}
	if reg.Count("manifest", "") == 0 {
		t.Fatal("the mirror saw no request")
	}
	// Without certs.d the same name goes nowhere, and the error says where it tried.
	_, err = (&images.Resolver{Remote: registry.New(registry.Config{})}).Resolve(ctx, upstream+"/demo:1.0")
	if err == nil || !strings.Contains(err.Error(), "tried https://"+upstream+"/v2") {
		t.Fatalf("error %v: want the endpoint it tried", err)
	}
}

// Every endpoint is named when all fail: the mirrors in order, then the
// upstream.
func TestResolveNamesEveryHostTried(t *testing.T) {
	dead := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	m1, m2 := dead(), dead()
	const upstream = "registry.gpupin.invalid"
	dir := hostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", upstream, m1, m2))
	_, err := (&images.Resolver{Remote: registry.New(registry.Config{HostsDir: dir})}).Resolve(context.Background(), upstream+"/demo:1.0")
	if err == nil {
		t.Fatal("resolved through dead hosts")
	}
	for _, want := range []string{"http://" + m1 + "/v2", "http://" + m2 + "/v2", "https://" + upstream + "/v2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
}

// A registry whose certificate is signed by a private CA is trusted when
// hosts.toml names the CA, for resolving as for pulling; without it, the
// error is the certificate's.
func TestResolveTLSWithCAFromHostsToml(t *testing.T) {
	ctx := context.Background()
	ca := testenv.CA(t)
	kp, err := ca.Server("registry", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.Distribution(t, sandbox.DistributionOptions{CertFile: kp.CertFile, KeyFile: kp.KeyFile})
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(d.Host + "/tls/demo:1.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, d.Remote(ca.Pool())...); err != nil {
		t.Fatal(err)
	}

	// The registry is reached as a mirror of a name of its own, so that
	// containerd's unverified HTTPS for loopback does not apply.
	const upstream = "registry.gpupin.invalid"
	mirror := func(extra string) string {
		return hostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"https://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n%s", upstream, d.Host, extra))
	}
	_, err = (&images.Resolver{Remote: registry.New(registry.Config{HostsDir: mirror("")})}).Resolve(ctx, upstream+"/tls/demo:1.0")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("resolved a registry of an unknown CA, or said something else: %v", err)
	}
	dir := mirror(fmt.Sprintf("  ca = %q\n", ca.CertFile))
	set, err := (&images.Resolver{Remote: registry.New(registry.Config{HostsDir: dir})}).Resolve(ctx, upstream+"/tls/demo:1.0")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Variants) != 1 || set.Variants[0].Variant != "cu129" || !set.Variants[0].Derived {
		t.Fatalf("variants %+v", set.Variants)
	}
}

// A 401 says whether credentials were found, where, and that the registry
// refused them.
func TestUnauthorizedSaysWhereCredentialsCameFrom(t *testing.T) {
	ctx := context.Background()
	d := testenv.Distribution(t, sandbox.DistributionOptions{User: "ci", Password: "s3cret"})
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(d.Host + "/private/demo:1.0")
	if err := remote.Write(ref, img, d.Remote(nil)...); err != nil {
		t.Fatal(err)
	}
	dockerConfig := func(user, pass string) string {
		dir := t.TempDir()
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		body := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, d.Host, auth)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, tc := range []struct {
		name   string
		config string // DOCKER_CONFIG; "" = an empty directory
		want   []string
	}{
		{"no credentials", "", []string{"none were found for " + d.Host, "docker login " + d.Host}},
		{"wrong credentials", dockerConfig("ci", "wrong"), []string{"were found in", "config.json", "refused by the registry"}},
		{"right credentials", dockerConfig("ci", "s3cret"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.config
			if dir == "" {
				dir = t.TempDir()
			}
			t.Setenv("DOCKER_CONFIG", dir)
			t.Setenv("REGISTRY_AUTH_FILE", "")
			t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
			_, err := (&images.Resolver{Remote: registry.New(registry.Config{})}).Resolve(ctx, d.Host+"/private/demo:1.0")
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("resolved without the right credentials")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// Resolving and pulling agree on plain HTTP: loopback and the registries
// named insecure, nothing else (no guess from a private address).
func TestPlainHTTPRule(t *testing.T) {
	p := registry.New(registry.Config{Insecure: []string{"10.0.0.7:5000"}})
	for host, want := range map[string]bool{
		"127.0.0.1:5000":  true,
		"localhost:5000":  true,
		"[::1]:5000":      true,
		"10.0.0.7:5000":   true,
		"10.0.0.8:5000":   false,
		"192.168.1.2":     false,
		"registry.local":  false,
		"reg.example.com": false,
	} {
		if got := p.PlainHTTP(host); got != want {
			t.Errorf("PlainHTTP(%s) = %v, want %v", host, got, want)
		}
	}
}

// A registry that does not answer, or stops sending, ends the request with
// a reason that says so, within the bounds the policy sets.
func TestStallsAreCut(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}
	silent := func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}
	trickle := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.oci.image.index.v1+json")
		w.Header().Set("Docker-Content-Digest", "sha256:"+strings.Repeat("0", 64))
		w.Header().Set("Content-Length", "4000")
		w.WriteHeader(http.StatusOK)
		for i := 0; i < 4000; i++ {
			if _, err := w.Write([]byte(" ")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
	// A token endpoint that never answers: the registry asks for a bearer
	// token from it.
	tokenLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tokenLn.Close()
	go func() {
		for {
			c, err := tokenLn.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	auth := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token",service="test"`, tokenLn.Addr()))
		w.WriteHeader(http.StatusUnauthorized)
	}
	for _, tc := range []struct {
		name string
		hook func(http.ResponseWriter, *http.Request)
		when string // path fragment the hook takes
		want string
	}{
		{"no answer to a manifest request", silent, "/manifests/", "no answer in 1s"},
		{"a manifest trickled", trickle, "/manifests/", "stalled"},
		{"a token endpoint that never answers", auth, "/v2/", "no answer in 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
				if !strings.Contains(r.URL.Path, tc.when) {
					return false
				}
				tc.hook(w, r)
				return true
			})
			defer reg.SetHook(nil)
			p := registry.New(registry.Config{HeaderTimeout: time.Second, StallTimeout: 2 * time.Second})
			start := time.Now()
			_, err := (&images.Resolver{Remote: p}).Resolve(ctx, reg.Host+"/demo:1.0")
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v: want %q", err, tc.want)
			}
			t.Logf("cut after %s: %v", took.Round(10*time.Millisecond), err)
		})
	}
}
