package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/runtime"
)

// registryPolicy is the one way this process reaches registries, for
// resolving and pulling alike.
func registryPolicy(c *cli.Context) *registry.Policy {
	return registry.New(registry.Config{
		HostsDir:      lineageString(c, "hosts-dir"),
		Insecure:      lineageSlice(c, "insecure-registry"),
		HeaderTimeout: lineageDuration(c, "registry-timeout"),
		StallTimeout:  lineageDuration(c, "registry-stall"),
	})
}

// nodeReader reads node facts from --node (at any level; simulated, and
// read again at every read) or NVML.
func nodeReader(c *cli.Context) (node.Reader, bool, error) {
	if p := lineageString(c, "node"); p != "" {
		if _, err := node.LoadFile(p); err != nil {
			return nil, true, err
		}
		return node.File(p), true, nil
	}
	return node.NewReader(), false, nil
}

// connect opens containerd as the global flags say.
func connect(c *cli.Context, policy *registry.Policy) (*runtime.Runtime, error) {
	opts := []runtime.Opt{
		runtime.WithNamespace(lineageString(c, "namespace")),
		runtime.WithSnapshotter(lineageString(c, "snapshotter")),
		runtime.WithLocalPrefix(lineageString(c, "local-prefix")),
		runtime.WithRegistry(policy),
	}
	if dirs := lineageSlice(c, "cdi-spec-dir"); len(dirs) > 0 {
		opts = append(opts, runtime.WithCDISpecDirs(dirs...))
	}
	if r := lineageString(c, "runc-root"); r != "" {
		opts = append(opts, runtime.WithRuncRoot(r))
	}
	rt, err := runtime.Connect(c.Context, lineageString(c, "address"), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w; --address or CONTAINERD_ADDRESS names another socket", err)
	}
	return rt, nil
}

// session is what a command that provisions or probes works with.
type session struct {
	rt        *runtime.Runtime
	nodes     node.Reader
	simulated bool
	opts      []provision.Option
}

func (s *session) close() {
	if s.rt != nil {
		s.rt.Close()
	}
}

func (s *session) provisioner(extra ...provision.Option) *provision.Provisioner {
	return provision.New(s.rt, append(append([]provision.Option(nil), s.opts...), extra...)...)
}

// openSession connects to containerd and reads the provisioning flags a
// command defines (those it lacks keep the library's defaults). A usage
// error is returned as such.
func openSession(c *cli.Context) (*session, error) {
	nodes, simulated, err := nodeReader(c)
	if err != nil {
		return nil, cli.Exit(err.Error(), exitError)
	}
	policy := registryPolicy(c)
	rt, err := connect(c, policy)
	if err != nil {
		return nil, cli.Exit(err.Error(), exitError)
	}
	s := &session{rt: rt, nodes: nodes, simulated: simulated}
	s.opts = []provision.Option{
		provision.WithNode(nodes),
		provision.WithOverrides(provision.OverrideFile(lineageString(c, "overrides"))),
	}
	if gpus, err := gpuSpec(c); err != nil {
		rt.Close()
		return nil, cli.Exit(err.Error(), exitUsage)
	} else if gpus != nil {
		s.opts = append(s.opts, provision.WithGPUs(*gpus))
	}
	for _, f := range []struct {
		name string
		set  func() provision.Option
	}{
		{"lock-dir", func() provision.Option { return provision.WithLockDir(c.String("lock-dir")) }},
		{"provision-timeout", func() provision.Option { return provision.WithTimeout(c.Duration("provision-timeout")) }},
		{"probe-timeout", func() provision.Option { return provision.WithProbeTimeout(c.Duration("probe-timeout")) }},
		{"probe", func() provision.Option { return provision.WithDefaultProbe(c.String("probe")) }},
		{"probe-dir", func() provision.Option { return provision.WithProbeDir(c.String("probe-dir")) }},
		{"cuda-probe", func() provision.Option { return provision.WithCUDAProbe(c.String("cuda-probe")) }},
		{"sim-probe", func() provision.Option { return provision.WithSimProbe(c.String("sim-probe")) }},
	} {
		if hasFlag(c, f.name) && c.String(f.name) != "" {
			s.opts = append(s.opts, f.set())
		}
	}
	for _, name := range []string{"provision-timeout", "probe-timeout"} {
		// Zero would end every provision (or probe) at once, or never.
		if hasFlag(c, name) && c.Duration(name) <= 0 {
			rt.Close()
			return nil, cli.Exit(fmt.Sprintf("--%s %s: want a positive duration such as 30m", name, c.Duration(name)), exitUsage)
		}
	}
	if hasFlag(c, "probe-memory") || hasFlag(c, "probe-pids") {
		mem, err := parseBytes(c.String("probe-memory"))
		if err == nil && mem == 0 {
			// The library reads 0 as "keep the default": refused here
			// rather than silently kept at 16 GiB.
			err = errors.New("the probe always has a memory limit (swap included); give a size such as 32g")
		}
		if err != nil {
			rt.Close()
			return nil, cli.Exit(fmt.Sprintf("--probe-memory %s: %v", c.String("probe-memory"), err), exitUsage)
		}
		if c.Int64("probe-pids") <= 0 {
			rt.Close()
			return nil, cli.Exit(fmt.Sprintf("--probe-pids %d: the probe always has a pids limit; give a positive one", c.Int64("probe-pids")), exitUsage)
		}
		s.opts = append(s.opts, provision.WithProbeLimits(mem, c.Int64("probe-pids")))
	}
	return s, nil
}

// hasFlag reports whether the command defines a flag.
func hasFlag(c *cli.Context, name string) bool {
	if c.Command == nil {
		return false
	}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}
