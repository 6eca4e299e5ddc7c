package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/trust"
	"github.com/gpupin/gpupin/trust/trusttest"
)

// TestPublishSignsBeforeTagging: publish --sign-key and build --push
// --sign-key push the signature of every digest they sign before any tag
// naming what they pushed (an alias or the tag), so a node whose policy
// requires a signature never reads the new tag unsigned; when a signature
// push is refused, no tag is written. The registry in front records every
// manifest PUT in order.
func TestPublishSignsBeforeTagging(t *testing.T) {
	isolateCredentials(t)
	const password = "pw"
	t.Setenv(trust.PasswordEnv, password)
	dir := t.TempDir()
	key := trusttest.WriteCosignKey(t, dir, "ci", trusttest.P256(t), password, "")
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ctx := context.Background()
	src := map[string]string{}
	for v, cuda := range map[string]string{"cu13": "13.0.1", "cu129": "12.9.1"} {
		img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=" + cuda}})
		if err != nil {
			t.Fatal(err)
		}
		src[v] = reg.Host + "/src/vllm:ci-" + v
		if _, err := sandbox.PushImage(ctx, src[v], img); err != nil {
			t.Fatal(err)
		}
	}
	spec := "engine: vllm\nversion: \"2.0\"\nrepository: " + reg.Host + "/org/built\nvariants:\n" +
		"  - {name: cu13, cuda: \"13.0\", base: scratch, platforms: [linux/amd64], layers: [{dir: ./app, dest: /opt/app}]}\n" +
		"  - {name: cu129, cuda: \"12.9\", base: scratch, platforms: [linux/amd64], layers: [{dir: ./app, dest: /opt/app}]}\n"
	if err := os.MkdirAll(filepath.Join(dir, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app", "run"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(dir, "gpupin.yaml")
	if err := os.WriteFile(specPath, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	publish := func(version string) []string {
		return []string{"publish", "--tag", reg.Host + "/org/vllm:" + version, "--variant", "cu13=" + src["cu13"], "--variant", "cu129=" + src["cu129"], "--sign-key", key, "--json"}
	}

	var mu sync.Mutex
	var puts []string // manifest PUT references, in order
	var refuse bool
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPut || !strings.Contains(r.URL.Path, "/manifests/") {
			return false
		}
		ref := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		mu.Lock()
		defer mu.Unlock()
		puts = append(puts, ref)
		if refuse && strings.HasSuffix(ref, ".sig") {
			http.Error(w, `{"errors":[{"code":"DENIED","message":"signatures refused"}]}`, http.StatusForbidden)
			return true
		}
		return false
	})

	for _, tc := range []struct {
		name   string
		args   []string
		tag    string // the tag the command writes
		refuse bool   // the registry refuses signature pushes
	}{
		{"publish", publish("1.0"), "org/vllm:1.0", false},
		{"build --push", []string{"build", "-f", specPath, "--push", "--sign-key", key, "--json"}, "org/built:2.0", false},
		{"publish, signature refused", publish("3.0"), "org/vllm:3.0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			puts, refuse = nil, tc.refuse
			mu.Unlock()
			out, msg, code := choiceRun(t, tc.args...)
			mu.Lock()
			got := append([]string(nil), puts...)
			mu.Unlock()
			firstTag, sigs := -1, map[string]int{}
			for i, ref := range got {
				switch {
				case strings.HasSuffix(ref, ".sig"):
					sigs[ref] = i
				case !strings.HasPrefix(ref, "sha256:") && firstTag < 0:
					firstTag = i
				}
			}
			if tc.refuse {
				if code == 0 || !strings.Contains(msg, "tag not written") || !strings.Contains(msg, "DENIED") {
					t.Fatalf("exit %d: %s", code, msg)
				}
				if firstTag >= 0 {
					t.Fatalf("a signature was refused, yet tag %s was written (PUTs %v)", got[firstTag], got)
				}
				if _, err := remote.Head(mustTagRef(t, reg.Host+"/"+tc.tag)); err == nil {
					t.Fatalf("%s exists after a refused signature", tc.tag)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, msg)
			}
			var res struct {
				Signatures []trust.Signed `json:"signatures"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Signatures) == 0 {
				t.Fatalf("no signatures in the output (%v): %s", err, out)
			}
			if firstTag < 0 {
				t.Fatalf("no tag written: %v", got)
			}
			for _, s := range res.Signatures {
				tag := s.Tag[strings.LastIndex(s.Tag, ":")+1:]
				i, ok := sigs[tag]
				if !ok {
					t.Errorf("signature of %s: no PUT of %s (PUTs %v)", s.Ref, tag, got)
				} else if i > firstTag {
					t.Errorf("signature %s pushed after tag %s: a node requiring a signature would refuse the tag meanwhile (PUTs %v)", tag, got[firstTag], got)
				}
			}
		})
	}
}

func mustTagRef(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}
