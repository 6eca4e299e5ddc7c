package cosign_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/gpupin/gpupin/trust"
)

// gpupinBinary is the gpupin that make built (GPUPIN_BIN, as make
// test-cosign passes it), else one built here from the main module.
// Without cgo: publish and build use no NVML, and no C toolchain is needed.
func gpupinBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("GPUPIN_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "gpupin")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/gpupin")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpupin: %v\n%s", err, out)
	}
	return bin
}

// gpupinRun runs the gpupin binary with COSIGN_PASSWORD set to password
// and an empty Docker config, and returns stdout, stderr and the exit code.
func gpupinRun(t *testing.T, bin, dir, password string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD="+password, "HOME="+home, "DOCKER_CONFIG="+home, "GPUPIN_SIGN_KEY=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	}
	t.Fatalf("gpupin %s: %v", strings.Join(args, " "), err)
	return "", "", -1
}

// cudaImage pushes a linux/amd64 image whose config says CUDA_VERSION, as
// an nvidia/cuda base's does: what publish checks a variant name against.
func cudaImage(t *testing.T, host, ref, cuda string) string {
	t.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"CUDA_VERSION=" + cuda}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	return tag.String()
}

// published is the part of publish's --json (and build's "publish") that
// the checks read.
type published struct {
	Tag     string `json:"tag"`
	Digest  string `json:"digest"`
	Entries []struct {
		Digest string `json:"digest"`
	} `json:"entries"`
	Aliases    map[string]string `json:"aliases"`
	Signatures []trust.Signed    `json:"signatures"`
}

// checkSigned verifies with cosign's own code (cosign verify --key PUB)
// the tag, every alias tag and every entry digest of a publish, and every
// entry with gpupin's verifier, as a node under a required policy would.
func checkSigned(t *testing.T, pubPath string, p published) {
	t.Helper()
	ctx := context.Background()
	tag, err := name.NewTag(p.Tag)
	if err != nil {
		t.Fatal(err)
	}
	refs := []name.Reference{tag}
	for a := range p.Aliases {
		refs = append(refs, mustTag(t, a))
	}
	for _, e := range p.Entries {
		refs = append(refs, tag.Context().Digest(e.Digest))
	}
	// The entries, the aliases and the index, each signed once.
	if want := len(p.Entries) + len(p.Aliases) + 1; len(p.Signatures) != want {
		t.Fatalf("%d signatures reported, want %d: %+v", len(p.Signatures), want, p.Signatures)
	}
	for _, ref := range refs {
		if n, err := cosignVerify(ctx, pubPath, ref); err != nil || n != 1 {
			t.Fatalf("cosign verify --key %s %s: %d signature(s), %v", filepath.Base(pubPath), ref, n, err)
		}
	}
	pol := gpupinPolicy(t, filepath.Dir(pubPath), filepath.Base(pubPath))
	for _, e := range p.Entries {
		if _, err := (&trust.Verifier{Policy: pol}).Verify(ctx, "vllm", "cu13", tag.Context().Digest(e.Digest).String(), ""); err != nil {
			t.Fatalf("gpupin's verifier on entry %s: %v", e.Digest, err)
		}
	}
}

// TestCLISignKeyCosignVerifies: `gpupin publish --sign-key` and `gpupin
// build --push --sign-key`, with a key cosign generated, write what
// cosign's verification accepts for the tag, the aliases and every
// variant manifest; a wrong password pushes nothing; a refused signature
// push fails the command and writes no tag (signatures go before tags).
func TestCLISignKeyCosignVerifies(t *testing.T) {
	bin := gpupinBinary(t)
	dir := t.TempDir()
	keyPath, pubPath := cosignKeyPair(t, dir, "ci")
	var refuseSigs atomic.Bool
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuseSigs.Load() && r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, ".sig") {
			http.Error(w, `{"errors":[{"code":"DENIED","message":"signatures refused"}]}`, http.StatusForbidden)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	cu13 := cudaImage(t, host, "src/vllm:ci-cu13", "13.0.1")
	cu129 := cudaImage(t, host, "src/vllm:ci-cu129", "12.9.1")
	publish := func(version string) []string {
		return []string{"publish", "--tag", host + "/org/vllm:" + version, "--variant", "cu13=" + cu13, "--variant", "cu129=" + cu129, "--sign-key", keyPath}
	}

	t.Run("publish", func(t *testing.T) {
		out, msg, code := gpupinRun(t, bin, dir, password, append(publish("1.0"), "--json")...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, msg)
		}
		var p published
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		checkSigned(t, pubPath, p)
		// A rerun signs nothing twice.
		out, msg, code = gpupinRun(t, bin, dir, password, publish("1.0")...)
		if code != 0 || !strings.Contains(out, "already signed") || strings.Count(out, "(1 signature(s)") != len(p.Signatures) {
			t.Fatalf("rerun: exit %d: %s\n%s", code, msg, out)
		}
	})

	t.Run("build --push", func(t *testing.T) {
		bdir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(bdir, "app"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bdir, "app", "run"), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		spec := "engine: vllm\nversion: \"2.0\"\nrepository: " + host + "/org/built\nvariants:\n" +
			"  - {name: cu13, cuda: \"13.0\", base: scratch, platforms: [linux/amd64], layers: [{dir: ./app, dest: /opt/app}]}\n" +
			"  - {name: cu129, cuda: \"12.9\", base: scratch, platforms: [linux/amd64], layers: [{dir: ./app, dest: /opt/app}]}\n"
		if err := os.WriteFile(filepath.Join(bdir, "gpupin.yaml"), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		_, msg, code := gpupinRun(t, bin, bdir, password, "build", "--sign-key", keyPath)
		if code != 2 || !strings.Contains(msg, "--push") {
			t.Fatalf("--sign-key without --push: exit %d: %s", code, msg)
		}
		out, msg, code := gpupinRun(t, bin, bdir, password, "build", "--push", "--sign-key", keyPath, "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, msg)
		}
		var b struct {
			Publish    published      `json:"publish"`
			Signatures []trust.Signed `json:"signatures"`
		}
		if err := json.Unmarshal([]byte(out), &b); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		b.Publish.Signatures = b.Signatures
		checkSigned(t, pubPath, b.Publish)
	})

	t.Run("wrong password pushes nothing", func(t *testing.T) {
		_, msg, code := gpupinRun(t, bin, dir, "hunter2", publish("3.0")...)
		if code == 0 || !strings.Contains(msg, "publish "+host+"/org/vllm:3.0: nothing pushed") || !strings.Contains(msg, "wrong password") {
			t.Fatalf("exit %d: %s", code, msg)
		}
		_, err := remote.Head(mustTag(t, host+"/org/vllm:3.0"))
		var te *transport.Error
		if !errors.As(err, &te) || te.StatusCode != http.StatusNotFound {
			t.Fatalf("the tag after a refused key: %v; want none", err)
		}
	})

	t.Run("refused signature push fails the publish", func(t *testing.T) {
		refuseSigs.Store(true)
		defer refuseSigs.Store(false)
		_, msg, code := gpupinRun(t, bin, dir, password, publish("4.0")...)
		for _, w := range []string{"publish " + host + "/org/vllm:4.0: pushed by digest, tag not written", "signing failed", "sign " + host + "/org/vllm@sha256:", "push signature image", "DENIED"} {
			if code == 0 || !strings.Contains(msg, w) {
				t.Fatalf("exit %d: %q lacks %q", code, msg, w)
			}
		}
		_, err := remote.Head(mustTag(t, host+"/org/vllm:4.0"))
		var te *transport.Error
		if !errors.As(err, &te) || te.StatusCode != http.StatusNotFound {
			t.Fatalf("the tag after a refused signature: %v; want none", err)
		}
	})
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}
