package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// `gpupin publish` reads --hosts-dir as nodes do: a name whose hosts.toml
// sends it to a TLS registry with the test's CA is published there and
// read back through the same hosts, on both registry implementations;
// without the hosts.toml the name goes nowhere.
func TestPublishHostsDir(t *testing.T) {
	ctx := context.Background()
	src := testenv.Registry(t)
	if _, err := sandbox.PublishEngine(ctx, src.Host, "vllm", "ci", []sandbox.EngineVariant{testenv.CU129}); err != nil {
		t.Fatal(err)
	}
	ca := testenv.CA(t)
	check, err := ca.Remote()
	if err != nil {
		t.Fatal(err)
	}
	const upstream = "registry.gpupin.invalid"
	for _, reg := range testenv.TLSRegistries(t, ca, testenv.TLSOptions{}) {
		t.Run(reg.Name, func(t *testing.T) {
			isolateCredentials(t)
			hosts := testenv.HostsToml(t, "", upstream, fmt.Sprintf("server = \"https://%s\"\nca = %q\n", reg.Host, ca.CertFile))
			args := []string{"publish", "--tag", upstream + "/org/vllm:1.0", "--variant", "cu129=" + src.Host + "/vllm:ci-cu129"}

			_, msg, code := choiceRun(t, append(args, "--hosts-dir", t.TempDir())...)
			if code != exitError || !strings.Contains(msg, upstream) {
				t.Fatalf("without the hosts.toml: exit %d, %s", code, msg)
			}

			out, msg, code := choiceRun(t, append(args, "--hosts-dir", hosts)...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, msg)
			}
			if !strings.Contains(out, "published "+upstream+"/org/vllm:1.0@sha256:") || !strings.Contains(out, "(verified)") {
				t.Fatalf("output:\n%s", out)
			}
			digest := out[strings.Index(out, "@")+1:]
			digest = digest[:strings.IndexAny(digest, " \n")]
			desc, err := remote.Head(mustParse(t, reg.Host+"/org/vllm:1.0"), check...)
			if err != nil {
				t.Fatal(err)
			}
			if desc.Digest.String() != digest {
				t.Fatalf("the registry holds %s, publish said %s", desc.Digest, digest)
			}
		})
	}
}
