package registry_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
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
	return testenv.HostsToml(t, dir, host, body)
}

// A name no DNS knows is resolved through the mirror containerd's certs.d
// names for it, on both registry implementations; the variants keep the
// upstream name, which is what pins are named by.
func TestResolveThroughCertsDMirror(t *testing.T) {
	ctx := context.Background()
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
				t.Fatal(err)
			}
			const upstream = "registry.gpupin.invalid"
			dir := hostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", upstream, reg.Host))
			if reg.InProcess != nil {
				reg.InProcess.Reset()
			}
			r := images.Resolver{Remote: registry.New(registry.Config{HostsDir: dir})}
			set, err := r.Resolve(ctx, upstream+"/demo:1.0")
			if err != nil {
				t.Fatal(err)
			}
			if len(set.Variants) != 1 || !strings.HasPrefix(set.Variants[0].Ref, upstream+"/demo@sha256:") {
				t.Fatalf("variants %+v: want the upstream name", set.Variants)
			}
			// The upstream name resolves nowhere, so an answer came from the
			// mirror; the in-process registry can say so too.
			if reg.InProcess != nil && reg.InProcess.Count("manifest", "") == 0 {
				t.Fatal("the mirror saw no request")
			}
			// Without certs.d the same name goes nowhere, and the error says where it tried.
			_, err = (&images.Resolver{Remote: registry.New(registry.Config{})}).Resolve(ctx, upstream+"/demo:1.0")
			if err == nil || !strings.Contains(err.Error(), "tried https://"+upstream+"/v2") {
				t.Fatalf("error %v: want the endpoint it tried", err)
			}
		})
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

// hosts.toml's TLS settings hold for resolving, on both registry
// implementations: a CA the test made (only in hosts.toml), a client
// certificate a registry demands, skip_verify. Without the setting the
// same resolution fails, with the reason.
func TestResolveTLSFromHostsToml(t *testing.T) {
	ctx := context.Background()
	ca := testenv.CA(t)
	clientCA := testenv.CA(t)
	client, err := clientCA.Client("client", "gpupin")
	if err != nil {
		t.Fatal(err)
	}
	push, err := ca.Remote(client)
	if err != nil {
		t.Fatal(err)
	}
	plainTLS := testenv.TLSRegistries(t, ca, testenv.TLSOptions{})
	mutualTLS := testenv.TLSRegistries(t, ca, testenv.TLSOptions{ClientCAs: []string{clientCA.CertFile}})
	for i := range plainTLS {
		for _, reg := range []testenv.Reg{plainTLS[i], mutualTLS[i]} {
			if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}, push...); err != nil {
				t.Fatal(err)
			}
		}
	}
	caLine := fmt.Sprintf("  ca = %q\n", ca.CertFile)
	clientLine := fmt.Sprintf("  client = [[%q, %q]]\n", client.CertFile, client.KeyFile)
	for _, tc := range []struct {
		name     string
		regs     []testenv.Reg
		with     string // hosts.toml lines that make it work
		without  string // the same, less the feature
		wantFail string
	}{
		{"ca", plainTLS, caLine, "", "certificate signed by unknown authority"},
		{"client certificate", mutualTLS, caLine + clientLine, caLine, "tls:"},
		{"skip_verify", plainTLS, "  skip_verify = true\n", "", "certificate signed by unknown authority"},
	} {
		for _, reg := range tc.regs {
			t.Run(tc.name+"/"+reg.Name, func(t *testing.T) {
				// The registry is reached as a mirror of a name of its own,
				// so that containerd's unverified HTTPS for loopback does
				// not apply.
				const upstream = "registry.gpupin.invalid"
				mirror := func(extra string) *registry.Policy {
					dir := hostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"https://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n%s", upstream, reg.Host, extra))
					return registry.New(registry.Config{HostsDir: dir})
				}
				_, err := (&images.Resolver{Remote: mirror(tc.without)}).Resolve(ctx, upstream+"/demo:1.0")
				if err == nil || !strings.Contains(err.Error(), tc.wantFail) {
					t.Fatalf("resolved without %s, or said something else: %v", tc.name, err)
				}
				set, err := (&images.Resolver{Remote: mirror(tc.with)}).Resolve(ctx, upstream+"/demo:1.0")
				if err != nil {
					t.Fatal(err)
				}
				if len(set.Variants) != 1 || set.Variants[0].Variant != "cu129" || set.Variants[0].Derived {
					t.Fatalf("variants %+v", set.Variants)
				}
			})
		}
	}
}

// override_path: a mirror whose API is not at /v2 (a registry behind a
// path on a shared host) is reached at the path hosts.toml gives, on both
// registry implementations; without override_path containerd appends /v2
// and finds nothing there.
func TestResolveOverridePath(t *testing.T) {
	ctx := context.Background()
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
				t.Fatal(err)
			}
			front := pathFront(t, "/api/registry", reg.Host)
			const upstream = "registry.gpupin.invalid"
			policy := func(extra string) *registry.Policy {
				dir := hostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\n\n[host.\"http://%s/api/registry\"]\n  capabilities = [\"pull\", \"resolve\"]\n%s", upstream, front, extra))
				return registry.New(registry.Config{HostsDir: dir})
			}
			if _, err := (&images.Resolver{Remote: policy("")}).Resolve(ctx, upstream+"/demo:1.0"); err == nil {
				t.Fatal("resolved without override_path: the front serves nothing under /api/registry/v2")
			}
			set, err := (&images.Resolver{Remote: policy("  override_path = true\n")}).Resolve(ctx, upstream+"/demo:1.0")
			if err != nil {
				t.Fatal(err)
			}
			if len(set.Variants) != 1 || !strings.HasPrefix(set.Variants[0].Ref, upstream+"/demo@sha256:") {
				t.Fatalf("variants %+v", set.Variants)
			}
		})
	}
}

// pathFront serves the registry at host under prefix instead of /v2, as a
// registry behind a path-routing proxy is; it returns its host:port.
func pathFront(t *testing.T, prefix, host string) string {
	t.Helper()
	target, err := url.Parse("http://" + host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, prefix+"/")
		if !ok && r.URL.Path != prefix {
			http.NotFound(w, r)
			return
		}
		r.URL.Path, r.URL.RawPath = "/v2/"+rest, ""
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
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

// The plain-HTTP rule: loopback and the registries named insecure, nothing
// else (no guess from a private address). Transport refuses by it;
// TestPrivateNamesGoOutAsHTTPS shows it on the wire.
func TestPlainHTTPRule(t *testing.T) {
	p := registry.New(registry.Config{Insecure: []string{"10.0.0.7:5000"}})
	for host, want := range map[string]bool{
		"127.0.0.1:5000": true,
		"localhost:5000": true,
		"[::1]:5000":     true,
		"10.0.0.7:5000":  true,
		"10.0.0.8:5000":  false,
		"192.168.1.2":    false,
		"registry.local": false,
		// go-containerregistry guesses plain HTTP for *.localhost; containerd does not.
		"registry.localhost:5000": false,
		"reg.example.com":         false,
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
		// Each is ErrStalled to a caller; the words say which bound cut it.
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
			if !errors.Is(err, registry.ErrStalled) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v: want ErrStalled, %q", err, tc.want)
			}
			t.Logf("cut after %s: %v", took.Round(10*time.Millisecond), err)
		})
	}
}
