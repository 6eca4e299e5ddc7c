package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// isolateCredentials points every place the Docker keychain looks at
// directories of the test's, so only what the test writes is found.
func isolateCredentials(t *testing.T) (dockerDir string) {
	t.Helper()
	home := t.TempDir()
	dockerDir = filepath.Join(home, "docker")
	if err := os.MkdirAll(dockerDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", home)
	t.Setenv("DOCKER_CONFIG", dockerDir)
	t.Setenv("REGISTRY_AUTH_FILE", "")
	t.Setenv("XDG_RUNTIME_DIR", home)
	return dockerDir
}

// A 401 from the registry says, through `gpupin plan`, whether credentials
// were found, where (the Docker config's path, or the credential helper's
// name), and that the registry refused them (issue 10, point 5), against
// Debian's docker-registry with htpasswd auth; with the right credentials
// the same plan works, so the message is about credentials and nothing
// else.
func TestPlanUnauthorizedSaysWhereCredentialsCameFromSimulated(t *testing.T) {
	d := testenv.Distribution(t, sandbox.DistributionOptions{User: "ci", Password: "s3cret"})
	ref := d.Host + "/org/vllm:0.11.0"
	img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, append(d.Remote(nil), remote.WithContext(context.Background()))...); err != nil {
		t.Fatalf("push with the registry's own credentials: %v", err)
	}
	w := &choiceWorld{dir: t.TempDir()}
	h580 := w.nodeFile(t, "h580", factsH100on580)
	overrides := filepath.Join(w.dir, "absent.yaml")

	dockerDir := isolateCredentials(t)
	configPath := filepath.Join(dockerDir, "config.json")
	auths := func(user, password string) string {
		return fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, d.Host, base64.StdEncoding.EncodeToString([]byte(user+":"+password)))
	}
	// A credential helper is a program on PATH: docker-credential-NAME get
	// reads the host on stdin and prints the credentials.
	helperDir := t.TempDir()
	helper := "#!/bin/sh\nread host\nprintf '{\"ServerURL\":\"%s\",\"Username\":\"ci\",\"Secret\":\"stale\"}\\n' \"$host\"\n"
	if err := os.WriteFile(filepath.Join(helperDir, "docker-credential-gpupintest"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", helperDir+string(os.PathListSeparator)+os.Getenv("PATH"))

	for _, tc := range []struct {
		name   string
		config string // config.json; "" = none
		code   int
		want   []string
		not    []string
	}{
		{name: "none found", code: exitError,
			want: []string{"none were found for " + d.Host, "looked in " + configPath, "docker login " + d.Host},
			not:  []string{"were found in"}},
		{name: "found in the config and refused", config: auths("ci", "wrong"), code: exitError,
			want: []string{"credentials for " + d.Host + " were found in " + configPath + " and refused by the registry"},
			not:  []string{"none were found"}},
		{name: "from a credential helper and refused", config: fmt.Sprintf(`{"credHelpers":{%q:"gpupintest"}}`, d.Host), code: exitError,
			want: []string{"were found in credential helper docker-credential-gpupintest (named in " + configPath + ") and refused by the registry"}},
		{name: "the right ones", config: auths("ci", "s3cret"), code: exitOK,
			want: []string{"1. cu129"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(configPath)
			if tc.config != "" {
				if err := os.WriteFile(configPath, []byte(tc.config), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			out, msg, code := choiceRun(t, "--overrides", overrides, "plan", ref, "--node", h580)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; error %q; stdout:\n%s", code, tc.code, msg, out)
			}
			for _, s := range tc.want {
				if !strings.Contains(msg+out, s) {
					t.Errorf("output lacks %q; error %q; stdout:\n%s", s, msg, out)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(msg, s) {
					t.Errorf("error says %q: %s", s, msg)
				}
			}
		})
	}
}

// noPlatform is img with os and architecture taken out of its config, as
// `crane append` leaves a new image.
func noPlatform(t *testing.T, img v1.Image) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "", "", ""
	out, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An image whose config names no os/architecture (what `crane append`
// makes) is refused with the fix, by `gpupin publish` and by `gpupin plan`
// of the image itself, on both registries (issue 10, point 5).
func TestConfigWithoutPlatformIsRefusedWithTheFixSimulated(t *testing.T) {
	for _, reg := range testenv.Registries(t) {
		t.Run(reg.Name, func(t *testing.T) {
			img, err := sandbox.Image(sandbox.ImageSpec{Env: []string{"CUDA_VERSION=12.9.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.9"}})
			if err != nil {
				t.Fatal(err)
			}
			bare := noPlatform(t, img)
			cf, _ := bare.ConfigFile()
			if cf.OS != "" || cf.Architecture != "" {
				t.Fatalf("config still names %s/%s", cf.OS, cf.Architecture)
			}
			src := reg.Host + "/ci/vllm:0.11.0-cu129-appended"
			if _, err := sandbox.PushImage(context.Background(), src, bare); err != nil {
				t.Fatal(err)
			}
			fix := "crane mutate --set-platform linux/amd64"

			tag := reg.Host + "/org/vllm:0.11.0"
			out, msg, code := choiceRun(t, "publish", "--tag", tag, "--variant", "cu129="+src)
			if code != exitError || !strings.Contains(msg, "names no os/architecture") || !strings.Contains(msg, fix) {
				t.Errorf("publish: exit %d, error %q, want exit 1 and the fix %q:\n%s", code, msg, fix, out)
			}
			if _, err := remote.Head(mustParse(t, tag)); err == nil {
				t.Errorf("publish refused, but %s was written", tag)
			}

			w := &choiceWorld{dir: t.TempDir()}
			out, msg, code = choiceRun(t, "--overrides", filepath.Join(w.dir, "absent.yaml"), "plan", src, "--node", w.nodeFile(t, "h580", factsH100on580))
			if code != exitError || !strings.Contains(msg, "names no os/architecture") || !strings.Contains(msg, fix) {
				t.Errorf("plan: exit %d, error %q, want exit 1 and the fix %q:\n%s", code, msg, fix, out)
			}
		})
	}
}

func mustParse(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
