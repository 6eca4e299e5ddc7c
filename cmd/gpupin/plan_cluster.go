package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/fleet"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

// clusterOverrides is plan's override source with --node-name: the
// cluster's resolution for the node, else the overrides file, as the
// agent merges them.
type clusterOverrides struct {
	res                   map[string]fleet.Resolution
	local                 provision.OverrideSource
	provision.NotSettable // plan reads them; the cluster's are set through the API
}

func readClusterOverrides(c *cli.Context, nodeName string) (*clusterOverrides, error) {
	cfg, err := fleet.ClientConfig(c.String("kubeconfig"), false)
	if err != nil {
		return nil, err
	}
	res, _, err := fleet.NodeChoices(c.Context, cfg, nodeName)
	if err != nil {
		return nil, err
	}
	return &clusterOverrides{res: res, local: provision.OverridesFromFile(lineageString(c, "overrides")),
		NotSettable: provision.NotSettable{Source: "the cluster's EngineOverrides for " + nodeName}}, nil
}

// Override implements provision.OverrideSource. A choice the node would
// refuse is not used: the agent keeps its last good one, which plan
// cannot know, so the file's answers (and annotate says so).
func (o *clusterOverrides) Override(engine string) (images.Override, bool, error) {
	if r, ok := o.res[engine]; ok && r.Err == nil {
		v, err := images.ParseOverride(r.Choice)
		return v, err == nil, err
	}
	return o.local.Override(engine)
}

// annotate names the EngineOverride a plan's override came from, and warns
// of one the node refuses or that shadowed others.
func (o *clusterOverrides) annotate(w io.Writer, pl *provision.Plan) {
	r, ok := o.res[pl.Engine]
	if !ok {
		return
	}
	if r.Err != nil {
		fmt.Fprintf(w, "warning: %s chooses %q for %s, which the node refuses (%v); the agent keeps its last good choice\n", r.Source(), r.Choice, pl.Engine, r.Err)
		return
	}
	if pl.OverrideFrom == provision.OverrideFromSource {
		pl.OverrideFrom = r.Source()
	}
	if len(r.Shadowed) > 0 {
		fmt.Fprintf(w, "note: %s wins by name over %v at the same level\n", r.Source(), r.Shadowed)
	}
}
