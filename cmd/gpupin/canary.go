package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpupin/gpupin/canary"
	"github.com/gpupin/gpupin/provision"
)

// canaryFlags are the agent's policy for new engine versions in a fleet
// (docs/fleet.md, "A canary per GPU class").
func canaryFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "canary", Value: true, EnvVars: []string{"GPUPIN_CANARY"},
			Usage: "with --node-name: the first node of each GPU class (GPU models, driver branch) proves a new engine version first; the class's others wait for its verdict and skip the variants whose probe failed there"},
		&cli.DurationFlag{Name: "canary-lease", Value: canary.DefaultLeaseDuration, EnvVars: []string{"GPUPIN_CANARY_LEASE"},
			Usage: "how long a canary's lease holds without a renewal: a canary that dies is replaced within it"},
		&cli.DurationFlag{Name: "canary-max-wait", Value: canary.DefaultMaxWait, EnvVars: []string{"GPUPIN_CANARY_MAX_WAIT"},
			Usage: "the longest a node waits on its class's canary before it tries every candidate itself"},
	}
}

// newCanary is the canary gate of the agent on Node name, or nil with
// --canary=false. Its leases live beside the fetch leases; verdicts are
// read from the canaries' GPUPinNode status, which the fleet layer writes.
func newCanary(c *cli.Context, cfg *rest.Config, name string) (provision.Canary, error) {
	if !c.Bool("canary") {
		return nil, nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("canary leases: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("canary verdicts: %w", err)
	}
	g, err := canary.New(cs.CoordinationV1(), dyn, fetchNamespace(c), name,
		canary.WithLeaseDuration(c.Duration("canary-lease")), canary.WithMaxWait(c.Duration("canary-max-wait")))
	if err != nil {
		return nil, usageError("%v", err)
	}
	return g, nil
}
