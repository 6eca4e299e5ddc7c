package trust_test

import (
	"context"
	"crypto/ecdsa"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/gpupin/gpupin/trust"
	"github.com/gpupin/gpupin/trust/trusttest"
)

// countingTransport counts the response bytes the verifier reads.
type countingTransport struct{ n atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		resp.Body = &countingBody{resp.Body, &c.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// BenchmarkVerify is what a required policy adds to one candidate over
// loopback: the time of one verification and the bytes it fetches
// (reported as fetched-B/op), for each place cosign puts a key signature:
// the classic sha256-<hex>.sig tag, and a Sigstore bundle referrer (cosign
// v3's default), which costs a failed .sig lookup, the referrers query and
// the bundle.
func BenchmarkVerify(b *testing.B) {
	for _, bc := range []struct {
		name string
		sign func(b *testing.B, priv *ecdsa.PrivateKey, img name.Digest)
	}{
		{"classic", func(b *testing.B, priv *ecdsa.PrivateKey, img name.Digest) {
			trusttest.SignClassic(b, priv, img, img, nil)
		}},
		{"bundle", func(b *testing.B, priv *ecdsa.PrivateKey, img name.Digest) {
			s, err := signature.LoadDefaultSigner(priv)
			if err != nil {
				b.Fatal(err)
			}
			h, err := v1.NewHash(img.DigestStr())
			if err != nil {
				b.Fatal(err)
			}
			pushBundleReferrer(b, img, keyBundle(b, s, h, ""))
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dir := b.TempDir()
			ci := newKey(b, dir, "ci.pub")
			pol := trusttest.Policy(b, dir, "engines:\n  vllm: {mode: required, keys: [ci.pub]}\n")
			g := trusttest.NewRegistry(b, true)
			img := g.Push(b, "org/vllm")
			bc.sign(b, ci, img)
			ct := &countingTransport{}
			v := &trust.Verifier{Policy: pol, Transport: ct}
			b.ResetTimer()
			for b.Loop() {
				if _, err := v.Verify(context.Background(), "vllm", "cu13", img.String(), ""); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(ct.n.Load())/float64(b.N), "fetched-B/op")
		})
	}
}
