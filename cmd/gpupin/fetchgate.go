package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/distribution/reference"
	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpupin/gpupin/fetchgate"
	"github.com/gpupin/gpupin/provision"
)

// fetchFlags are the agent's policy for new images in a fleet
// (docs/fleet.md, "One fetch per image").
func fetchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "fetch-concurrency", Value: fetchgate.DefaultConcurrency, EnvVars: []string{"GPUPIN_FETCH_CONCURRENCY"},
			Usage: "with --node-name: how many nodes may fetch one new digest from upstream at once (a Lease per digest); the others wait, then pull through their mirror; 0: no coordination"},
		&cli.DurationFlag{Name: "fetch-lease", Value: fetchgate.DefaultLeaseDuration, EnvVars: []string{"GPUPIN_FETCH_LEASE"},
			Usage: "how long a fetcher's lease holds without progress: a fetcher that dies or stalls is replaced within it"},
		&cli.DurationFlag{Name: "fetch-max-wait", Value: fetchgate.DefaultMaxWait, EnvVars: []string{"GPUPIN_FETCH_MAX_WAIT"},
			Usage: "the longest a node waits for another node's fetch before it fetches from upstream itself"},
		&cli.StringFlag{Name: "fetch-namespace", EnvVars: []string{"GPUPIN_FETCH_NAMESPACE"},
			Usage: "`NAMESPACE` of the fetch leases (default: --wants-configmap's, else the pod's, else gpupin-system)"},
	}
}

// newFetchGate is the gate the agent's pulls go through on Node name, or
// nil with --fetch-concurrency 0.
func newFetchGate(c *cli.Context, cfg *rest.Config, name string, s *session) (provision.FetchGate, error) {
	n := c.Int("fetch-concurrency")
	if n == 0 {
		return nil, nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("fetch leases: %w", err)
	}
	opts := []fetchgate.Option{fetchgate.WithConcurrency(n), fetchgate.WithLeaseDuration(c.Duration("fetch-lease")),
		fetchgate.WithMaxWait(c.Duration("fetch-max-wait"))}
	if s.rt != nil {
		rt := s.rt
		opts = append(opts,
			fetchgate.WithMirrors(func(ctx context.Context, ref string) ([]string, error) {
				named, err := reference.ParseNormalizedNamed(ref)
				if err != nil {
					return nil, fmt.Errorf("reference %s: %w", ref, err)
				}
				m, err := rt.Registry().Mirrors(ctx, reference.Domain(named))
				return m.Hosts, err
			}),
			// An image record of the digested name is a finished pull:
			// pulling it again fetches nothing.
			fetchgate.WithLocal(func(ctx context.Context, ref string) bool {
				_, err := rt.Client().ImageService().Get(namespaces.WithNamespace(ctx, rt.Namespace()), ref)
				return err == nil
			}),
			fetchgate.WithStored(provision.ImageStored(rt)))
	}
	g, err := fetchgate.New(cs.CoordinationV1(), fetchNamespace(c), name, opts...)
	if err != nil {
		return nil, usageError("%v", err)
	}
	return g, nil
}

// fetchNamespace is where the leases live: beside the wants ConfigMap,
// else the pod's own namespace, else the manifests' gpupin-system.
func fetchNamespace(c *cli.Context) string {
	if ns := c.String("fetch-namespace"); ns != "" {
		return ns
	}
	if ns, _, ok := strings.Cut(c.String("wants-configmap"), "/"); ok && ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b))
	}
	return "gpupin-system"
}
