package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/registry"
)

// oneVariant is the smallest thing worth publishing: cu129 for amd64.
func oneVariant() []srcVariant {
	return []srcVariant{{name: "cu129", env: cu129Env, archs: []string{"amd64"}}}
}

// Publish reaches a registry as nodes do: a CA that only a certs.d
// hosts.toml names, a client certificate it holds, skip_verify, on both
// registry implementations. The registry is reached under a name of its
// own (dialled to loopback), where no loopback rule applies; without the
// hosts.toml the same publish fails before anything is pushed.
func TestPublishTLSFromHostsToml(t *testing.T) {
	ctx := context.Background()
	src := testenv.Registry(t)
	variants := pushSources(t, src.Host, oneVariant())
	ca := testenv.CA(t)
	clientCA := testenv.CA(t)
	client, err := clientCA.Client("client", "ci")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"registry.gpupin.test", "127.0.0.1"}
	plainTLS := testenv.TLSRegistries(t, ca, testenv.TLSOptions{Names: names})
	mutualTLS := testenv.TLSRegistries(t, ca, testenv.TLSOptions{Names: names, ClientCAs: []string{clientCA.CertFile}})
	check, err := ca.Remote(client)
	if err != nil {
		t.Fatal(err)
	}
	const host = "registry.gpupin.test:5000"
	caLine := fmt.Sprintf("ca = %q\n", ca.CertFile)
	clientLine := fmt.Sprintf("client = [[%q, %q]]\n", client.CertFile, client.KeyFile)
	for _, tc := range []struct {
		name     string
		regs     []testenv.Reg
		with     string // hosts.toml that makes it work
		without  string // the same, less the feature ("" = no hosts.toml)
		wantFail string
	}{
		{"ca", plainTLS, caLine, "", "certificate signed by unknown authority"},
		{"client certificate", mutualTLS, caLine + clientLine, caLine, "tls:"},
		{"skip_verify", plainTLS, "skip_verify = true\n", "", "certificate signed by unknown authority"},
	} {
		for i := range tc.regs {
			reg := tc.regs[i]
			t.Run(tc.name+"/"+reg.Name, func(t *testing.T) {
				d := &testenv.Dialer{Routes: map[string]string{host: reg.Host}}
				policy := func(body string) *registry.Policy {
					dir := t.TempDir()
					if body != "" {
						testenv.HostsToml(t, dir, host, body)
					}
					return registry.New(registry.Config{HostsDir: dir, DialContext: d.DialContext})
				}
				// A repository of the case's own: the cases share registries.
				repo := strings.ReplaceAll(strings.ReplaceAll(tc.name, " ", "-"), "_", "-") + "/vllm:1.0"
				tag := host + "/" + repo
				_, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, Registry: policy(tc.without)})
				if err == nil || !strings.Contains(err.Error(), tc.wantFail) {
					t.Fatalf("published without %s, or failed otherwise: %v", tc.name, err)
				}
				t.Logf("without %s: %v", tc.name, err)
				if _, err := remote.Head(testenv.MustRef(t, reg.Host+"/"+repo), check...); !notFound(err) {
					t.Fatalf("a failed publish left the tag, or the check failed: %v", err)
				}
				for _, dl := range d.Dials() {
					if dl.Addr == host && !dl.TLS() {
						t.Errorf("a connection to %s spoke plain HTTP", dl.Addr)
					}
				}

				res, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, Registry: policy(tc.with)})
				if err != nil {
					t.Fatal(err)
				}
				if !res.Verified || !strings.HasPrefix(res.Tag, host+"/") {
					t.Fatalf("result %+v", res)
				}
				desc, err := remote.Head(testenv.MustRef(t, reg.Host+"/"+repo), check...)
				if err != nil {
					t.Fatal(err)
				}
				if desc.Digest.String() != res.Digest {
					t.Fatalf("the registry holds %s, publish says %s", desc.Digest, res.Digest)
				}
			})
		}
	}
}

// notFound reports a registry's "no such manifest".
func notFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

// A registry under a private address that serves plain HTTP is refused
// before anything is pushed, with the fix in the error; named insecure,
// the same publish goes through and reads back as nodes read it. On both
// registry implementations. go-containerregistry alone would push over
// plain HTTP there (an RFC 1918 address), so publish used to write a tag
// nodes could not read.
func TestPublishRefusesPlainHTTPToPrivateAddress(t *testing.T) {
	ctx := context.Background()
	src := testenv.Registry(t)
	variants := pushSources(t, src.Host, oneVariant())
	const host = "10.0.0.7:5000"
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			d := &testenv.Dialer{Routes: map[string]string{host: reg.Host}}
			tag := host + "/org/vllm:1.0"
			_, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, Registry: registry.New(registry.Config{DialContext: d.DialContext})})
			if !errors.Is(err, registry.ErrPlainHTTP) || !strings.Contains(err.Error(), "--insecure-registry "+host) || !strings.Contains(err.Error(), "tag not written") {
				t.Fatalf("error does not refuse plain HTTP with the fix:\n%v", err)
			}
			for _, dl := range d.Dials() {
				if dl.Addr == host && dl.PlainHTTP() {
					t.Fatalf("plain HTTP went out to %s", dl.Addr)
				}
			}
			if repos := catalog(t, reg.Host); len(repos) != 0 {
				t.Fatalf("a refused publish wrote %v", repos)
			}

			res, err := Publish(ctx, PublishOptions{Tag: tag, Variants: variants, Registry: registry.New(registry.Config{Insecure: []string{host}, DialContext: d.DialContext})})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Verified {
				t.Fatal("not verified")
			}
			if repos := catalog(t, reg.Host); len(repos) != 1 || repos[0] != "org/vllm" {
				t.Fatalf("registry holds %v, want org/vllm", repos)
			}
		})
	}
}

// catalog lists a plain-HTTP loopback registry's repositories.
func catalog(t *testing.T, host string) []string {
	t.Helper()
	resp, err := http.Get("http://" + host + "/v2/_catalog")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct {
		Repositories []string `json:"repositories"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatalf("catalog: %v", err)
	}
	return c.Repositories
}

// Publish takes its credentials from the registry policy, as resolution
// does, and a refusal says where they came from.
func TestPublishCredentialsFromPolicy(t *testing.T) {
	ctx := context.Background()
	src := testenv.Registry(t)
	variants := pushSources(t, src.Host, oneVariant())
	d := testenv.Distribution(t, sandbox.DistributionOptions{User: "ci", Password: "s3cret"})
	for _, tc := range []struct {
		name, password string
		want           string // in the error; "" = success
	}{
		{"wrong password", "wrong", "refused by the registry"},
		{"right password", "s3cret", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			creds := func(h string) (registry.Credential, error) {
				if h != d.Host {
					return registry.Credential{Source: "the test"}, nil
				}
				return registry.Credential{User: "ci", Secret: tc.password, Source: "the test's keyring"}, nil
			}
			res, err := Publish(ctx, PublishOptions{Tag: d.Host + "/org/vllm:1.0", Variants: variants, Registry: registry.New(registry.Config{Credentials: creds})})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !res.Verified {
					t.Fatal("not verified")
				}
				set, err := (&images.Resolver{Remote: registry.New(registry.Config{Credentials: creds})}).Resolve(ctx, d.Host+"/org/vllm:1.0")
				if err != nil || len(set.Variants) != 1 {
					t.Fatalf("nodes read %+v, %v", set, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the test's keyring") {
				t.Fatalf("error %v: want %q and where the credentials came from", err, tc.want)
			}
		})
	}
}
