package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/registry"
	"github.com/gpupin/gpupin/trust"
)

// session is what a command works with: node facts, containerd, and the
// provisioner options its flags say. It is the one place flags become
// library options.
type session struct {
	rt *containerd.Runtime // nil when containerd is not used or not reached
	// rtErr says why containerd was not reached, where it was optional.
	rtErr     error
	nodes     node.Reader
	simulated bool // node facts from --node
	opts      []provision.Option
	// verifier is --trust-policy's, nil without it.
	verifier *trust.Verifier
}

// containerdUse is how a command needs containerd.
type containerdUse int

const (
	needContainerd containerdUse = iota // the command fails without it
	tryContainerd                       // used when it answers
	noContainerd
)

// inSession opens a session, runs fn in it, closes it, and turns fn's
// error into an exit code (exitCode).
func inSession(c *cli.Context, use containerdUse, fn func(*session) error) error {
	s, err := openSession(c, use)
	if err != nil {
		return exitCode(err)
	}
	defer s.close()
	return exitCode(fn(s))
}

// exitCode is err as the exit codes scripts rely on: 2 for a usage error
// (an invalid want), 3 for no result (an unsupported node, a disabled
// engine, no candidate), 1 otherwise. An exit already decided stays.
func exitCode(err error) error {
	var ec cli.ExitCoder
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ec):
		return err
	case errors.Is(err, provision.ErrInvalidWant):
		return cli.Exit(err.Error(), exitUsage)
	case errors.Is(err, provision.ErrUnsupported), errors.Is(err, provision.ErrDisabled), errors.Is(err, provision.ErrNoCandidate):
		return cli.Exit(err.Error(), exitNoResult)
	}
	return cli.Exit(err.Error(), exitError)
}

// usageError is a flag's value refused.
func usageError(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), exitUsage)
}

func (s *session) close() {
	if s.rt != nil {
		s.rt.Close()
	}
}

// provisioner is a Provisioner over the session's containerd, or over
// none (Plan then reads no pins): New(nil), since a nil *containerd.Runtime
// would be a Runtime that is not nil, which New refuses. The options come
// from flags, so one refused is a usage error.
func (s *session) provisioner(extra ...provision.Option) (*provision.Provisioner, error) {
	opts := append(append([]provision.Option(nil), s.opts...), extra...)
	var rt provision.Runtime
	if s.rt != nil {
		rt = s.rt
	}
	p, err := provision.New(rt, opts...)
	if err != nil {
		return nil, usageError("%v", err)
	}
	return p, nil
}

// openSession reads the node, registry, provisioning and GPU flags a
// command defines (those it lacks keep the library's defaults) and
// connects to containerd as use says.
func openSession(c *cli.Context, use containerdUse) (*session, error) {
	s := &session{}
	var err error
	if s.nodes, s.simulated, err = nodeReader(c); err != nil {
		return nil, err
	}
	policy := registryPolicy(c)
	s.opts = []provision.Option{
		provision.WithNode(s.nodes),
		provision.WithResolver(&images.Resolver{Remote: policy}),
		provision.WithOverrides(provision.OverridesFromFile(lineageString(c, "overrides"))),
	}
	flagged, err := provisionOptions(c)
	if err != nil {
		return nil, err
	}
	s.opts = append(s.opts, flagged...)
	if f := lineageString(c, "trust-policy"); f != "" {
		pol, err := trust.Load(f)
		if err != nil {
			return nil, usageError("%v", err)
		}
		// Signatures come over the same TLS, hosts.toml and credentials
		// as publish's reads of a registry.
		s.verifier = &trust.Verifier{Policy: pol, Transport: policy.Transport(c.Context), Keychain: policy.Keychain()}
		s.opts = append(s.opts, provision.WithVerifier(s.verifier))
	}
	if use == noContainerd {
		return s, nil
	}
	if s.rt, s.rtErr = connect(c, policy); s.rtErr != nil && use == needContainerd {
		return nil, s.rtErr
	}
	return s, nil
}

// provisionOptions are the options of the provisioning, probe and GPU
// flags the command defines, checked.
func provisionOptions(c *cli.Context) ([]provision.Option, error) {
	var opts []provision.Option
	gpus, err := gpuSpec(c)
	if err != nil {
		return nil, usageError("%v", err)
	}
	if gpus != nil {
		opts = append(opts, provision.WithGPUs(*gpus))
	}
	// Checked here for the flag's own wording (WithDefaultProbe refuses it
	// too, in New): a usage error, before containerd or a registry is asked.
	if hasFlag(c, "probe") && c.String("probe") != "" {
		if _, err := probe.ParseDefault(c.String("probe")); err != nil {
			return nil, usageError("--probe %s: %v", c.String("probe"), err)
		}
	}
	for _, f := range []struct {
		name string
		set  func(string) provision.Option
	}{
		{"lock-dir", provision.WithLockDir},
		{"probe", provision.WithDefaultProbe},
		{"probe-dir", provision.WithProbeDir},
		{"cuda-probe", provision.WithCUDAProbe},
		{"sim-probe", provision.WithSimProbe},
	} {
		if hasFlag(c, f.name) && c.String(f.name) != "" {
			opts = append(opts, f.set(c.String(f.name)))
		}
	}
	for _, f := range []struct {
		name string
		set  func(time.Duration) provision.Option
	}{
		{"provision-timeout", provision.WithTimeout},
		{"probe-timeout", provision.WithProbeTimeout},
	} {
		if !hasFlag(c, f.name) {
			continue
		}
		// Zero would end every provision (or probe) at once, or never.
		if d := c.Duration(f.name); d <= 0 {
			return nil, usageError("--%s %s: want a positive duration such as 30m", f.name, d)
		}
		opts = append(opts, f.set(c.Duration(f.name)))
	}
	if hasFlag(c, "probe-memory") || hasFlag(c, "probe-pids") {
		mem, err := parseBytes(c.String("probe-memory"))
		if err == nil && mem == 0 {
			// The library reads 0 as "keep the default": refused here
			// rather than silently kept at 16 GiB.
			err = errors.New("the probe always has a memory limit (swap included); give a size such as 32g")
		}
		if err != nil {
			return nil, usageError("--probe-memory %s: %v", c.String("probe-memory"), err)
		}
		if c.Int64("probe-pids") <= 0 {
			return nil, usageError("--probe-pids %d: the probe always has a pids limit; give a positive one", c.Int64("probe-pids"))
		}
		opts = append(opts, provision.WithProbeLimits(mem, c.Int64("probe-pids")))
	}
	if v := c.String("prefetch-fallback"); hasFlag(c, "prefetch-fallback") && v != "" {
		n, err := parseBytes(v)
		if err != nil {
			return nil, usageError("--prefetch-fallback %s: %v", v, err)
		}
		opts = append(opts, provision.WithPrefetch(int64(min(n, 1<<62))))
	}
	return opts, nil
}

// registryPolicy is the one way this process reaches registries, for
// resolving, pulling and publishing alike.
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

// connect opens containerd as the global and runtime flags say.
func connect(c *cli.Context, policy *registry.Policy) (*containerd.Runtime, error) {
	opts := []containerd.Opt{
		containerd.WithNamespace(lineageString(c, "namespace")),
		containerd.WithSnapshotter(lineageString(c, "snapshotter")),
		containerd.WithLocalPrefix(lineageString(c, "local-prefix")),
		containerd.WithRegistry(policy),
	}
	if dirs := lineageSlice(c, "cdi-spec-dir"); len(dirs) > 0 {
		opts = append(opts, containerd.WithCDISpecDirs(dirs...))
	}
	if r := lineageString(c, "runc-root"); r != "" {
		opts = append(opts, containerd.WithRuncRoot(r))
	}
	if fromLineage(c, "keep-layers", (*cli.Context).Bool, func(v bool) bool { return v }) {
		opts = append(opts, containerd.WithKeepLayers(true))
	}
	// The unpack strategy is for benchmarks and diagnosis: read from the
	// environment here; the library reads none.
	unpack, err := containerd.ParseUnpack(os.Getenv(containerd.EnvUnpack))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", containerd.EnvUnpack, err)
	}
	opts = append(opts, containerd.WithUnpack(unpack), containerd.WithDecompress(decompressOptions()))
	rt, err := containerd.Connect(c.Context, lineageString(c, "address"), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w; --address or CONTAINERD_ADDRESS names another socket", err)
	}
	return rt, nil
}

// decompressOptions reads containerd's own switches for the gzip
// commands (bench sets them on the CLI); the library reads none.
func decompressOptions() containerd.DecompressOptions {
	off := func(env string) bool { v, _ := strconv.ParseBool(os.Getenv(env)); return v }
	return containerd.DecompressOptions{NoIgzip: off(containerd.EnvDisableIgzip), NoPigz: off(containerd.EnvDisablePigz)}
}

// gpuSpec reads --gpu-mode and --gpus; nil when neither is given, so the
// library's default holds (every GPU through CDI; none on a simulated node).
func gpuSpec(c *cli.Context) (*containerd.GPUs, error) {
	if !hasFlag(c, "gpu-mode") || (!c.IsSet("gpu-mode") && !c.IsSet("gpus")) {
		return nil, nil
	}
	g, err := containerd.ParseGPUs(c.String("gpu-mode"), c.StringSlice("gpus"))
	return &g, err
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
