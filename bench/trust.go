package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/cryptoutils"

	gimages "github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/trust"
)

// signedImage is the trust rows' image: published, signed as `gpupin
// publish --sign-key` signs (variant manifest and index), and the policy
// file that requires that key.
type signedImage struct {
	ref, child, index string
	layerBytes        int64
	policy            string
}

// publishSigned publishes a random-bytes image of size bytes under its own
// engine name, signs its variant and its index with a key made here, and
// writes a policy requiring that key for the engine.
func (e *env) publishSigned(ctx context.Context, size int64) (signedImage, error) {
	layers, err := cachedLayers(e.cfg.cache, size)
	if err != nil {
		return signedImage{}, err
	}
	const engine = "signed"
	idx, err := sandbox.PublishEngine(ctx, e.reg.Host, engine, "1.0", []sandbox.EngineVariant{
		{Name: "cu13", CUDA: "13.0", Archs: "9.0", Layers: layers},
	})
	if err != nil {
		return signedImage{}, fmt.Errorf("publish %s: %w", engine, err)
	}
	si := signedImage{ref: fmt.Sprintf("%s/%s:1.0", e.reg.Host, engine), index: idx.String()}
	set, err := (&gimages.Resolver{}).Resolve(ctx, si.ref)
	if err != nil {
		return signedImage{}, err
	}
	si.child = set.Variants[0].Ref
	for _, l := range layers {
		n, _ := l.Size()
		si.layerBytes += n
	}
	key, err := benchSignKey(e.dir)
	if err != nil {
		return signedImage{}, err
	}
	s := &trust.Signer{Key: key}
	for _, ref := range []string{si.child, fmt.Sprintf("%s/%s@%s", e.reg.Host, engine, si.index)} {
		d, err := name.NewDigest(ref)
		if err != nil {
			return signedImage{}, err
		}
		if _, err := s.Sign(ctx, d); err != nil {
			return signedImage{}, err
		}
	}
	si.policy = filepath.Join(e.dir, "trust-policy.yaml")
	pol := "engines:\n  " + engine + ": {mode: required, keys: [ci.pub]}\n"
	if err := os.WriteFile(si.policy, []byte(pol), 0o644); err != nil {
		return signedImage{}, err
	}
	return si, nil
}

// benchSignKey writes a P-256 pair as `cosign generate-key-pair` does
// (dir/ci.key, empty password; dir/ci.pub) and loads the private half.
func benchSignKey(dir string) (*trust.SignKey, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	enc, err := encrypted.Encrypt(der, nil)
	if err != nil {
		return nil, fmt.Errorf("encrypt signing key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: trust.SigstorePrivateKeyPEM, Bytes: enc})
	pub, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		return nil, err
	}
	keyPath := filepath.Join(dir, "ci.key")
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "ci.pub"), pub, 0o644); err != nil {
		return nil, err
	}
	return trust.LoadSignKey(keyPath, keyPEM, nil)
}

// sigTraffic is what verification fetched: the requests for signatures
// (the sha256-<hex>.sig tag, its layers, referrers) among reqs.
func sigTraffic(reqs []sandbox.Request, sigBlobs map[string]bool) (n int, bytes int64) {
	for _, q := range reqs {
		if strings.Contains(q.Path, ".sig") || strings.Contains(q.Path, "/referrers/") || sigBlobs[q.Path[strings.LastIndex(q.Path, "/")+1:]] {
			n++
			bytes += q.Bytes
		}
	}
	return n, bytes
}

// trustRows measures what a required signature policy adds to a cold
// provision: the signed image provisioned with the policy and without,
// interleaved, against ctr pull + run of the same child; and the
// verification alone, in process, with what it fetches.
func (e *env) trustRows(ctx context.Context) ([]row, error) {
	// Published and signed once: a second signing key would append a
	// second signature, and the verifier would read both.
	if e.signed == nil {
		si, err := e.publishSigned(ctx, e.cfg.trustSize)
		if err != nil {
			return nil, err
		}
		e.signed = &si
	}
	si := *e.signed
	// The signature image's layers: their blob GETs count as verification's.
	sigBlobs := map[string]bool{}
	h, _ := name.NewDigest(si.child)
	sigTag := h.Context().Tag(strings.Replace(h.DigestStr(), ":", "-", 1) + ".sig")
	img, err := remote.Image(sigTag, remote.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", sigTag, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", sigTag, err)
	}
	for _, l := range m.Layers {
		sigBlobs[l.Digest.String()] = true
	}
	polEnv := []string{"GPUPIN_TRUST_POLICY=" + si.policy}
	var off, req, ctr []result
	var diffs []time.Duration
	var sigN []int64
	var sigB []int64
	for i := 0; i < e.cfg.runs; i++ {
		o, err := e.coldGpupin(ctx, "inproc", si.ref, si.layerBytes)
		if err != nil {
			return nil, err
		}
		if n, _ := sigTraffic(e.reg.Requests(), sigBlobs); n != 0 {
			return nil, fmt.Errorf("gpupin provision without a policy fetched %d signature objects", n)
		}
		r, err := e.coldGpupinEnv(ctx, polEnv, "inproc", si.ref, si.layerBytes)
		if err != nil {
			return nil, fmt.Errorf("provision with a required policy: %w", err)
		}
		n, b := sigTraffic(e.reg.Requests(), sigBlobs)
		if n == 0 {
			return nil, fmt.Errorf("gpupin provision with a required policy fetched no signature: the policy was not applied")
		}
		c, err := e.coldCtr(ctx, "inproc", si.child, si.layerBytes, i)
		if err != nil {
			return nil, err
		}
		off, req, ctr = append(off, o), append(req, r), append(ctr, c)
		diffs = append(diffs, r.dur-o.dur)
		sigN, sigB = append(sigN, int64(n)), append(sigB, b)
		logf("trust run %d: provision without policy %s, with required %s (%d signature requests, %d B), ctr %s", i+1,
			o.dur.Round(time.Millisecond), r.dur.Round(time.Millisecond), n, b, c.dur.Round(time.Millisecond))
	}

	// The verification alone, as provision calls it, over loopback.
	pol, err := trust.Load(si.policy)
	if err != nil {
		return nil, err
	}
	v := &trust.Verifier{Policy: pol}
	const n = 21
	var vt []time.Duration
	var vN, vB int64
	for i := 0; i < n; i++ {
		e.reg.Reset()
		t0 := time.Now()
		sig, err := v.Verify(ctx, "signed", "cu13", si.child, si.index)
		if err != nil {
			return nil, err
		}
		if sig == nil {
			return nil, fmt.Errorf("verify %s: the required policy verified nothing", si.child)
		}
		vt = append(vt, time.Since(t0))
		reqs := e.reg.Requests()
		vN = int64(len(reqs))
		vB = 0
		for _, q := range reqs {
			vB += q.Bytes
		}
	}
	// The whole process without the pull: plan, which verifies each
	// candidate under the policy, against plan without one. Small enough
	// that the verification is not lost in a pull's noise.
	var pOff, pReq []time.Duration
	for i := 0; i < n; i++ {
		o, err := e.gpupin("", "plan", si.ref)
		if err != nil {
			return nil, err
		}
		r, err := e.gpupinEnv(polEnv, "", "plan", si.ref)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(r.out, "passes, signed by") {
			return nil, fmt.Errorf("plan under the required policy did not verify:\n%s", tail(r.out))
		}
		pOff, pReq = append(pOff, o.dur), append(pReq, r.dur)
	}
	mo, mr, mc := medianOf(off), medianOf(req), medianOf(ctr)
	mib := e.cfg.trustSize >> 20
	return []row{
		{
			name:   fmt.Sprintf("signature policy required: cold provision of a signed image, %d MiB in %d layers", mib, layersPerImage),
			gpupin: secs(mr.dur), ref: secs(mo.dur) + " (the same provision, no policy)", ratio: ratio(mr.dur, mo.dur),
			notes: fmt.Sprintf("cosign key signature (classic .sig) over the variant and the index, as publish --sign-key writes; added per run (paired) median %s; %s; %s; ctr pull + ctr run --rm of the child %s (required / that %s); verification fetched %d requests, %d bytes (of %.0f MB of layers)",
				ms(median(diffs)), spread("required", req), spread("off", off), secs(mc.dur), ratio(mr.dur, mc.dur), medianInt(sigN), medianInt(sigB), float64(si.layerBytes)/1e6),
		},
		{
			name:   "signature verification alone (trust.Verifier, in process)",
			gpupin: fmt.Sprintf("%s, %d requests, %d bytes", ms(median(vt)), vN, vB),
			ref:    secs(mc.dur) + " (ctr pull + ctr run --rm of the child)",
			ratio:  fmt.Sprintf("%.4f", median(vt).Seconds()/mc.dur.Seconds()),
			notes:  fmt.Sprintf("median of %d over loopback; P-256 key; requests and bytes are all the verifier sent and read, registry pings included: the .sig manifest and its payload layer are the signature's %d requests, %d bytes; the variant's signature verifies first, so the index's is not read", n, medianInt(sigN), medianInt(sigB)),
		},
		{
			name:   "signature policy required: gpupin plan of the signed image (process)",
			gpupin: ms(median(pReq)), ref: ms(median(pOff)) + " (gpupin plan, no policy)", ratio: ratio(median(pReq), median(pOff)),
			notes: fmt.Sprintf("median of %d each, interleaved; the policy loaded, the candidate verified and said to pass: the verification's cost in a whole process, without a pull's noise", n),
		},
	}, nil
}
