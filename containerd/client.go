package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"

	"github.com/gpupin/gpupin/containerd/conn"
	"github.com/gpupin/gpupin/containerd/pins"
	"github.com/gpupin/gpupin/containerd/pull"
	"github.com/gpupin/gpupin/containerd/run"
	"github.com/gpupin/gpupin/registry"
)

// Runtime talks to one containerd namespace, through its three parts.
type Runtime struct {
	conn *conn.Conn
	pull *pull.Puller
	pins *pins.Store
	run  *run.Runner
}

// options are what the Opts set, for Connect to hand to the parts.
type options struct {
	namespace   string
	snapshotter string
	registry    *registry.Policy
	runcRoot    string
	fifoDir     string
	cdiDirs     []string
	localPrefix string            // of the node-local names (pins/local.go)
	keepLayers  bool              // store every layer's blob, even one extracted here (pull/direct.go)
	unpack      UnpackStrategy    // how layers are unpacked (pull/unpack.go)
	decompress  DecompressOptions // which gzip commands pulls may run (pull/decompress.go)
}

// Opt configures a Runtime: what Connect hands to its parts.
type Opt func(*options)

// WithNamespace sets the containerd namespace (default gpupin). An empty
// one keeps the default: CONTAINERD_NAMESPACE= (set, but empty) reaches
// here as "", and containerd would refuse every call with "namespace is
// required".
func WithNamespace(ns string) Opt {
	return func(o *options) {
		if ns != "" {
			o.namespace = ns
		}
	}
}

// WithSnapshotter sets the snapshotter (default overlayfs).
func WithSnapshotter(s string) Opt { return func(o *options) { o.snapshotter = s } }

// WithRegistry sets how registries are reached (certs.d mirrors, TLS,
// plain HTTP, credentials, timeouts): pass the policy manifest resolution
// uses too, so that what is resolved is what is pulled. Default:
// registry.New's defaults.
func WithRegistry(p *registry.Policy) Opt { return func(o *options) { o.registry = p } }

// WithRuncRoot moves runc's state directory (tests keep it out of /run/runc).
func WithRuncRoot(dir string) Opt { return func(o *options) { o.runcRoot = dir } }

// WithFIFODir sets where the containers' stdio FIFOs are made.
func WithFIFODir(dir string) Opt { return func(o *options) { o.fifoDir = dir } }

// WithCDISpecDirs sets where CDI specs are read (default /etc/cdi, /var/run/cdi).
func WithCDISpecDirs(dirs ...string) Opt { return func(o *options) { o.cdiDirs = dirs } }

// WithKeepLayers stores every layer blob a pull downloads in the content
// store, as containerd's own pull does, for ctr export, a push from the node, or a
// pull that resumes. By default a layer this process extracted while it
// downloaded, and verified, is not stored: a node runs from its snapshots,
// and storing the blob costs the daemon a write, a hash and an fsync of
// every byte, and the node the disk (pull/direct.go).
func WithKeepLayers(keep bool) Opt { return func(o *options) { o.keepLayers = keep } }

// WithUnpack sets how pulls unpack (ParseUnpack; default gpupin's
// parallel pipeline). The CLI reads it from EnvUnpack.
func WithUnpack(s UnpackStrategy) Opt { return func(o *options) { o.unpack = s } }

// WithDecompress turns off gzip commands pulls would run (default: igzip,
// else unpigz, whichever is installed). The CLI reads it from
// EnvDisableIgzip and EnvDisablePigz.
func WithDecompress(o DecompressOptions) Opt { return func(opts *options) { opts.decompress = o } }

// Defaults of Connect and its options, which the CLI's flags name.
const (
	// DefaultAddress is containerd's own socket.
	DefaultAddress = defaults.DefaultAddress
	// DefaultNamespace keeps the CLI's pins apart from kubelet's k8s.io.
	DefaultNamespace   = "gpupin"
	DefaultSnapshotter = "overlayfs"
)

// DefaultCDIDirs are where CDI specs are read, as the CDI registry's own
// default (static specs first, then generated ones).
func DefaultCDIDirs() []string { return []string{"/etc/cdi", "/var/run/cdi"} }

// WithLocalPrefix sets the prefix of the node-local names (default
// DefaultLocalPrefix): a registry host, optionally with a path
// ("registry.internal/gpupin"). Connect refuses one that does not make
// references.
func WithLocalPrefix(prefix string) Opt { return func(o *options) { o.localPrefix = prefix } }

// Connect dials containerd and checks that it answers.
func Connect(ctx context.Context, address string, opts ...Opt) (*Runtime, error) {
	o := &options{namespace: DefaultNamespace, snapshotter: DefaultSnapshotter, cdiDirs: DefaultCDIDirs()}
	for _, opt := range opts {
		opt(o)
	}
	r := &Runtime{}
	if o.registry == nil {
		o.registry = registry.New(registry.Config{})
	}
	if o.localPrefix == "" {
		o.localPrefix = DefaultLocalPrefix
	}
	if err := pins.CheckLocalPrefix(o.localPrefix); err != nil {
		return nil, err
	}
	// A strategy made by a conversion rather than ParseUnpack.
	if _, err := pull.ParseStrategy(string(o.unpack)); err != nil {
		return nil, err
	}
	if _, err := os.Stat(address); err != nil {
		// The path is said once: a PathError would repeat it.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("containerd socket %s: %w (is containerd running, and at that address?)", address, err)
	}
	c, err := client.New(address, client.WithDefaultNamespace(o.namespace), client.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Version(vctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w", address, err)
	}
	if o.fifoDir == "" {
		o.fifoDir = filepath.Join(os.TempDir(), "gpupin-fifo")
	}
	r.conn = &conn.Conn{Client: c, Namespace: o.namespace, Snapshotter: o.snapshotter, Registry: o.registry}
	r.pull = pull.New(r.conn, pull.WithKeepLayers(o.keepLayers), pull.WithStrategy(o.unpack), pull.WithDecompress(o.decompress))
	r.run = run.New(r.conn, o.runcRoot, o.fifoDir, o.cdiDirs)
	if r.pins, err = pins.New(r.conn, o.localPrefix, pins.Deps{Synced: r.pull.Sync, SweepProbes: r.run.SweepProbes}); err != nil {
		r.pull.Close()
		c.Close()
		return nil, err
	}
	return r, nil
}

// Close closes the connection.
func (r *Runtime) Close() error {
	r.pull.Close()
	return r.conn.Client.Close()
}

// Client exposes containerd's client for what this package does not wrap.
func (r *Runtime) Client() *client.Client { return r.conn.Client }

// Namespace is the containerd namespace in use.
func (r *Runtime) Namespace() string { return r.conn.Namespace }

// Registry is the policy pulls go through.
func (r *Runtime) Registry() *registry.Policy { return r.conn.Registry }

// WithLease runs fn under a lease that keeps what it fetches and creates
// until it returns; the lease is labelled so a sweep removes it if this
// process dies first.
func (r *Runtime) WithLease(ctx context.Context, fn func(ctx context.Context) error) error {
	return r.conn.WithLease(ctx, fn)
}

// The parts, for a caller that wants one of them alone.

// Puller is the pull engine.
func (r *Runtime) Puller() *pull.Puller { return r.pull }

// Store is the pin store.
func (r *Runtime) Store() *pins.Store { return r.pins }

// Runner runs containers.
func (r *Runtime) Runner() *run.Runner { return r.run }
