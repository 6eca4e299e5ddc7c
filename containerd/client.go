package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gpupin/gpupin/registry"
)

// Labels gpupin puts on what it creates, so it can find it again.
const (
	LabelManaged = "io.gpupin.managed" // on every record gpupin made
	LabelOwner   = "io.gpupin.owner"   // pid:starttime:pidns of the process that made a transient record
	LabelRole    = "io.gpupin.role"    // candidate, probe, replica
	// LabelCreated marks image records gpupin created itself; gc deletes
	// only those, and only lets go of records it adopted (a record kubelet
	// pulled that gpupin then proved and pinned).
	LabelCreated = "io.gpupin.created"
)

// Runtime talks to one containerd namespace.
type Runtime struct {
	client      *client.Client
	namespace   string
	snapshotter string
	registry    *registry.Policy
	runcRoot    string
	fifoDir     string
	cdiDirs     []string
	localPrefix string // of the node-local names (local.go)
	keepLayers  bool   // store every layer's blob, even one extracted here (direct.go)
	flush       *flusher

	foreignMu sync.Mutex
	onForeign func(Recovered) // OnForeign
}

// Opt configures a Runtime.
type Opt func(*Runtime)

// WithNamespace sets the containerd namespace (default gpupin). An empty
// one keeps the default: CONTAINERD_NAMESPACE= (set, but empty) reaches
// here as "", and containerd would refuse every call with "namespace is
// required".
func WithNamespace(ns string) Opt {
	return func(r *Runtime) {
		if ns != "" {
			r.namespace = ns
		}
	}
}

// WithSnapshotter sets the snapshotter (default overlayfs).
func WithSnapshotter(s string) Opt { return func(r *Runtime) { r.snapshotter = s } }

// WithRegistry sets how registries are reached (certs.d mirrors, TLS,
// plain HTTP, credentials, timeouts): pass the policy manifest resolution
// uses too, so that what is resolved is what is pulled. Default:
// registry.New's defaults.
func WithRegistry(p *registry.Policy) Opt { return func(r *Runtime) { r.registry = p } }

// WithRuncRoot moves runc's state directory (tests keep it out of /run/runc).
func WithRuncRoot(dir string) Opt { return func(r *Runtime) { r.runcRoot = dir } }

// WithFIFODir sets where the containers' stdio FIFOs are made.
func WithFIFODir(dir string) Opt { return func(r *Runtime) { r.fifoDir = dir } }

// WithCDISpecDirs sets where CDI specs are read (default /etc/cdi, /var/run/cdi).
func WithCDISpecDirs(dirs ...string) Opt { return func(r *Runtime) { r.cdiDirs = dirs } }

// WithKeepLayers stores every layer blob a pull downloads in the content
// store, as containerd's own pull does, for ctr export, a push from the node, or a
// pull that resumes. By default a layer this process extracted while it
// downloaded, and verified, is not stored: a node runs from its snapshots,
// and storing the blob costs the daemon a write, a hash and an fsync of
// every byte, and the node the disk (direct.go).
func WithKeepLayers(keep bool) Opt { return func(r *Runtime) { r.keepLayers = keep } }

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

// Connect dials containerd and checks that it answers.
func Connect(ctx context.Context, address string, opts ...Opt) (*Runtime, error) {
	r := &Runtime{namespace: DefaultNamespace, snapshotter: DefaultSnapshotter, cdiDirs: DefaultCDIDirs(), flush: newFlusher()}
	for _, o := range opts {
		o(r)
	}
	if r.registry == nil {
		r.registry = registry.New(registry.Config{})
	}
	if r.localPrefix == "" {
		r.localPrefix = DefaultLocalPrefix
	}
	if err := checkLocalPrefix(r.localPrefix); err != nil {
		return nil, err
	}
	if _, err := os.Stat(address); err != nil {
		return nil, fmt.Errorf("containerd socket %s: %w (is containerd running, and at that address?)", address, err)
	}
	c, err := client.New(address, client.WithDefaultNamespace(r.namespace), client.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Version(vctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w", address, err)
	}
	if r.fifoDir == "" {
		r.fifoDir = filepath.Join(os.TempDir(), "gpupin-fifo")
	}
	r.client = c
	return r, nil
}

// Close closes the connection.
func (r *Runtime) Close() error {
	r.flush.close()
	return r.client.Close()
}

// Client exposes containerd's client for what this package does not wrap.
func (r *Runtime) Client() *client.Client { return r.client }

// Namespace is the containerd namespace in use.
func (r *Runtime) Namespace() string { return r.namespace }

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.namespace)
}
