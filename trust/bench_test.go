package trust_test

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

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

// BenchmarkVerifyClassic is what a required policy adds to one candidate
// over loopback: the time of one verification and the bytes it fetches
// (reported as fetched-B/op).
func BenchmarkVerifyClassic(b *testing.B) {
	dir := b.TempDir()
	ci := newKey(b, dir, "ci.pub")
	pol := trusttest.Policy(b, dir, "engines:\n  vllm: {mode: required, keys: [ci.pub]}\n")
	g := trusttest.NewRegistry(b, true)
	img := g.Push(b, "org/vllm")
	trusttest.SignClassic(b, ci, img, img, nil)
	ct := &countingTransport{}
	v := &trust.Verifier{Policy: pol, Transport: ct}
	b.ResetTimer()
	for b.Loop() {
		if _, err := v.Verify(context.Background(), "vllm", "cu13", img.String(), ""); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(ct.n.Load())/float64(b.N), "fetched-B/op")
}
