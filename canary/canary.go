// Package canary has the first node of each GPU class (GPU models and
// driver branch, as `gpupin fleet` groups them) prove a new engine version
// before the class's other nodes try it.
//
// A node that wants a version it has no pin for asks Gate.Await. The gate
// takes a coordination.k8s.io/v1 Lease named after the class and the
// version; the node that makes it is the canary and provisions at once,
// renewing the lease while it does. The others watch the lease. When the
// canary's GPUPinNode status shows its outcome, it marks the lease done;
// the others then read that status (the variant it pinned, the variants
// whose probe failed) and skip what failed there. Each wait is bounded: a
// canary that dies stops renewing and loses the lease within its duration
// (a waiter takes it and proves itself); one that hangs holds the others
// at most MaxWait; an API server that does not answer for the lease
// duration ends the wait. Waiting never touches a pin: it only orders
// attempts. See docs/fleet.md.
package canary

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/dynamic"
	typedcoord "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// Defaults: a canary that dies costs its class half a minute; one that
// hangs, at most 15 minutes (the fetch gate's bound: a canary's time is
// mostly its pull).
const (
	DefaultLeaseDuration = 30 * time.Second
	DefaultMaxWait       = 15 * time.Minute
	// DefaultStatusWait is how long a canary waits for its own status to
	// show its outcome before it lets the lease go without a verdict.
	DefaultStatusWait = time.Minute
)

// Annotations on a canary's Lease: what it is for, and where it stands.
const (
	AnnotationClass = "gpupin.io/canary-class"
	AnnotationKey   = "gpupin.io/canary-key"
	AnnotationState = "gpupin.io/canary-state"
	// LabelCanary marks gpupin's canary leases, for listing them.
	LabelCanary = "gpupin.io/canary"
)

// A lease's states: proving (its holder provisions), done (the holder's
// GPUPinNode shows the verdict), released (the holder gave up: the next
// node proves).
const (
	stateProving  = "proving"
	stateDone     = "done"
	stateReleased = "released"
)

// Option configures a Gate.
type Option func(*Gate) error

// WithLeaseDuration sets how long a canary's lease holds without a
// renewal (default 30 s).
func WithLeaseDuration(d time.Duration) Option {
	return func(g *Gate) error {
		if d < time.Second {
			return fmt.Errorf("canary lease duration %s: at least 1s", d)
		}
		g.leaseDuration = d
		return nil
	}
}

// WithMaxWait sets the longest a node waits on its class's canary before
// it tries every candidate itself (default 15 minutes).
func WithMaxWait(d time.Duration) Option {
	return func(g *Gate) error {
		if d <= 0 {
			return fmt.Errorf("canary max wait %s: must be positive (no canary: leave the gate out)", d)
		}
		g.maxWait = d
		return nil
	}
}

// WithStatusWait sets how long a canary waits for its GPUPinNode to show
// its outcome before it releases the lease without a verdict.
func WithStatusWait(d time.Duration) Option {
	return func(g *Gate) error {
		if d <= 0 {
			return fmt.Errorf("canary status wait %s: must be positive", d)
		}
		g.statusWait = d
		return nil
	}
}

// WithLogger sets the gate's logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(g *Gate) error {
		if l == nil {
			return errors.New("canary.WithLogger(nil)")
		}
		g.log = l
		return nil
	}
}

// Gate is one node's side of the canaries (provision.Canary).
type Gate struct {
	leases    typedcoord.LeasesGetter
	nodes     dynamic.Interface
	namespace string
	identity  string

	leaseDuration time.Duration
	maxWait       time.Duration
	statusWait    time.Duration
	log           *slog.Logger
	now           func() time.Time
}

// New makes the gate of node identity (its Node's name, which names its
// GPUPinNode): leases in namespace, statuses through nodes.
func New(leases typedcoord.LeasesGetter, nodes dynamic.Interface, namespace, identity string, opts ...Option) (*Gate, error) {
	if namespace == "" || identity == "" {
		return nil, errors.New("canary: a namespace and the node's name are needed")
	}
	g := &Gate{leases: leases, nodes: nodes, namespace: namespace, identity: identity,
		leaseDuration: DefaultLeaseDuration, maxWait: DefaultMaxWait, statusWait: DefaultStatusWait,
		log: slog.Default(), now: time.Now}
	for _, o := range opts {
		if err := o(g); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// LeaseName names the lease of class and key: a DNS label, whatever the
// GPU's name or the version hold.
func LeaseName(class, key string) string {
	sum := sha256.Sum256([]byte(class + "\x00" + key))
	return "gpupin-canary-" + hex.EncodeToString(sum[:])[:20]
}
