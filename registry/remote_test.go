package registry_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/registry"
)

// A private address or a .local(host) name is not guessed to be plain HTTP, by
// containerd's resolver (resolution, pulls) nor by the transport publish
// pushes through: the request goes out as HTTPS, and only a registry named
// insecure is spoken to in plain HTTP. The names are dialled to a real
// plain-HTTP registry on loopback, and each connection's first byte says
// what was sent. go-containerregistry's own transport is the control: it
// falls back to plain HTTP for these names, which is what publish did.
func TestPrivateNamesGoOutAsHTTPS(t *testing.T) {
	ctx := context.Background()
	reg := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo", "1.0", []sandbox.EngineVariant{cu129}); err != nil {
		t.Fatal(err)
	}
	const insecure = "10.0.0.8:5000"
	names := []string{"10.0.0.7:5000", "192.168.1.2:5000", "172.16.0.9:5000", "registry.local:5000", "registry.localhost:5000", insecure}
	clients := []struct {
		name string
		read func(p *registry.Policy, d *testenv.Dialer, host string) error
	}{
		{"containerd resolver", func(p *registry.Policy, _ *testenv.Dialer, host string) error {
			_, err := (&images.Resolver{Remote: p}).Resolve(ctx, host+"/demo:1.0")
			return err
		}},
		{"publish transport", func(p *registry.Policy, _ *testenv.Dialer, host string) error {
			ref, err := name.ParseReference(host + "/demo:1.0")
			if err != nil {
				return err
			}
			_, err = remote.Head(ref, remote.WithContext(ctx), remote.WithTransport(p.Transport(ctx)), remote.WithAuthFromKeychain(p.Keychain()))
			return err
		}},
	}
	for _, host := range names {
		for _, c := range clients {
			t.Run(c.name+"/"+host, func(t *testing.T) {
				d := &testenv.Dialer{Routes: map[string]string{host: reg.Host}}
				p := registry.New(registry.Config{Insecure: []string{insecure}, DialContext: d.DialContext})
				reg.Reset()
				err := c.read(p, d, host)
				dials := d.Dials()
				if len(dials) == 0 {
					t.Fatalf("no connection to %s: %v", host, err)
				}
				if host == insecure {
					if err != nil {
						t.Fatalf("a registry named insecure: %v", err)
					}
					for _, dl := range dials {
						if !dl.PlainHTTP() {
							t.Errorf("a connection to the insecure %s did not speak plain HTTP", dl.Addr)
						}
					}
					return
				}
				if err == nil {
					t.Fatalf("read %s from a plain-HTTP registry", host)
				}
				for _, dl := range dials {
					if !dl.TLS() {
						t.Errorf("a connection to %s did not begin with a TLS handshake", dl.Addr)
					}
				}
				if n := len(reg.Requests()); n != 0 {
					t.Errorf("the registry answered %d plain-HTTP requests", n)
				}
				// Where go-containerregistry would fall back to plain HTTP,
				// the transport's refusal says how to allow it.
				guessed, _ := name.NewRegistry(host)
				if c.name == "publish transport" && guessed.Scheme() == "http" && (!errors.Is(err, registry.ErrPlainHTTP) || !strings.Contains(err.Error(), "--insecure-registry "+host)) {
					t.Errorf("error does not refuse plain HTTP with the fix:\n%v", err)
				}
				t.Logf("%v", err)
			})
		}
	}
	t.Run("control: go-containerregistry alone", func(t *testing.T) {
		d := &testenv.Dialer{Routes: map[string]string{"10.0.0.7:5000": reg.Host}}
		tr := remote.DefaultTransport.(*http.Transport).Clone()
		tr.DialContext = d.DialContext
		if _, err := remote.Head(name.MustParseReference("10.0.0.7:5000/demo:1.0"), remote.WithTransport(tr)); err != nil {
			t.Fatalf("go-containerregistry no longer falls back to plain HTTP for RFC 1918 names (%v): the transport's refusal may be moot", err)
		}
		plain := false
		for _, dl := range d.Dials() {
			plain = plain || dl.PlainHTTP()
		}
		if !plain {
			t.Fatal("go-containerregistry reached the registry without plain HTTP")
		}
	})
}

// The transport refuses a plain-HTTP request before it dials: nothing of
// it leaves the machine.
func TestTransportRefusesPlainHTTPBeforeDialling(t *testing.T) {
	d := &testenv.Dialer{}
	p := registry.New(registry.Config{Insecure: []string{"10.0.0.8:5000"}, DialContext: d.DialContext})
	for _, tc := range []struct {
		url     string
		refused bool
	}{
		{"http://10.0.0.7:5000/v2/", true},
		{"http://registry.local/v2/", true},
		{"http://registry.example.com/v2/", true},
		{"http://10.0.0.8:5000/v2/", false}, // named insecure
		{"http://127.0.0.1:1/v2/", false},   // loopback
	} {
		t.Run(tc.url, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := len(d.Dials())
			resp, err := p.Transport(context.Background()).RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			refused := errors.Is(err, registry.ErrPlainHTTP)
			if refused != tc.refused {
				t.Fatalf("refused %v, want %v: %v", refused, tc.refused, err)
			}
			if dialled := len(d.Dials()) > before; dialled == refused {
				t.Fatalf("dialled %v for a request refused %v", dialled, refused)
			}
		})
	}
}
