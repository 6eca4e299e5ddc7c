// Package fetchgate lets about one node of a fleet fetch a new image from
// its upstream registry while the others wait, then pull it through their
// peer-to-peer mirror (Spegel), which by then has every layer.
//
// A node asks the gate before it pulls a digest (Gate.Fetch). The gate
// takes a coordination.k8s.io/v1 Lease named after the digest (one of
// Concurrency slots); the node that holds one pulls at once, renewing the
// lease only while its pull moves bytes, lists in it each layer as the
// layer lands in its content store (its mirror serves it from there), and
// marks it fetched once every layer has (unpack and probe go on
// meanwhile), or unserved where its mirror no longer answers, and the
// next node fetches. The others pull at once too, but fetch each layer
// only once the holder lists it, so their pulls run a layer behind the
// holder's; a holder that goes is replaced by one of them, mid-pull. Each
// wait is bounded: a holder that dies or stalls stops renewing and loses
// its lease within LeaseDuration; an API server that cannot be reached for
// OutageBound, a mirror that is absent or does not answer, or MaxWait
// spent, and the node pulls from upstream itself. The gate never touches a
// pin or an image: it only orders pulls. See docs/fleet.md.
package fetchgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	typedcoord "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/gpupin/gpupin/internal/kubelease"
)

// Defaults: a lease lives 30 s without progress, so a dead or stalled
// fetcher costs the others half a minute; a wait ends after 15 minutes
// (a 25 GB image at about 30 MB/s), and after 30 s without the API.
const (
	DefaultConcurrency   = 1
	DefaultLeaseDuration = 30 * time.Second
	DefaultMaxWait       = 15 * time.Minute
	// DefaultMinProgress is what a fetcher must have moved since its last
	// renewal to renew again: 1 MiB in 10 s, about 100 KiB/s.
	DefaultMinProgress = 1 << 20
	// DefaultUnpackGrace is how long a fetcher that has every byte keeps
	// renewing while its pull unpacks (no bytes move then).
	DefaultUnpackGrace = 5 * time.Minute
	// DefaultRetain is how long a finished or abandoned lease is kept
	// before a gate deletes it.
	DefaultRetain = time.Hour
)

// Pull is the pull the gate orders: it reports the layer bytes fetched so
// far (done of total known) as they move and, where await is not nil,
// calls it before it fetches each layer blob.
type Pull = func(ctx context.Context, progress func(done, total int64), await Await) error

// Await returns once the layer blob of digest dg may be fetched: a peer
// holds it (the node's mirror serves it), or this node is to fetch it from
// upstream. Its error is ctx's.
type Await = func(ctx context.Context, dg string) error

// Option configures a Gate.
type Option func(*config) error

type config struct {
	concurrency   int
	leaseDuration time.Duration
	renewEvery    time.Duration
	maxWait       time.Duration
	outageBound   time.Duration
	minProgress   int64
	unpackGrace   time.Duration
	retain        time.Duration
	mirrors       func(ctx context.Context, ref string) ([]string, error)
	mirrorTimeout time.Duration
	local         func(ctx context.Context, ref string) bool
	stored        func(ctx context.Context, ref string) (layers []string, all bool)
	logger        *slog.Logger
}

// WithConcurrency sets how many nodes may fetch one digest from upstream
// at once (default 1). Zero or less is refused: leave the gate out instead.
func WithConcurrency(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithConcurrency(%d): at least one node fetches; run without a gate for no coordination", n)
		}
		c.concurrency = n
		return nil
	}
}

// WithLeaseDuration sets how long a lease holds without a renewal (default
// 30 s): a dead or stalled fetcher is replaced within it. Renewals come at
// a third of it.
func WithLeaseDuration(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("WithLeaseDuration(%s): at least 1s (the API counts whole seconds)", d)
		}
		c.leaseDuration = d.Truncate(time.Second)
		return nil
	}
}

// WithMaxWait bounds one wait for another node's fetch (default 15 min);
// then the node fetches from upstream itself.
func WithMaxWait(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithMaxWait(%s): a wait must end; give a positive bound", d)
		}
		c.maxWait = d
		return nil
	}
}

// WithOutageBound sets how long a waiting node goes without reaching the
// API server before it fetches from upstream (default: the lease duration,
// the time a holder it cannot see could have died in).
func WithOutageBound(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithOutageBound(%s): give a positive bound", d)
		}
		c.outageBound = d
		return nil
	}
}

// WithMinProgress sets the bytes a fetcher must move between renewals to
// renew (default 1 MiB): progress, not wall time, keeps a lease.
func WithMinProgress(n int64) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("WithMinProgress(%d): at least one byte", n)
		}
		c.minProgress = n
		return nil
	}
}

// WithUnpackGrace sets how long a fetcher with every byte in keeps its
// lease while it unpacks (default 5 min).
func WithUnpackGrace(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("WithUnpackGrace(%s): negative", d)
		}
		c.unpackGrace = d
		return nil
	}
}

// WithRetain sets how long finished and abandoned leases are kept before a
// gate deletes them (default 1 h).
func WithRetain(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithRetain(%s): give a positive time", d)
		}
		c.retain = d
		return nil
	}
}

// WithMirrors says which mirrors a reference's pull tries before its
// registry (containerd's hosts configuration: registry.Policy.Mirrors).
// None named: the node does not wait, as nothing would bring the image
// from a peer. Without this option every reference counts as mirrored.
func WithMirrors(fn func(ctx context.Context, ref string) ([]string, error)) Option {
	return func(c *config) error { c.mirrors = fn; return nil }
}

// WithLocal says whether a reference is already on the node (its pull
// costs no fetch): such a pull does not wait.
func WithLocal(fn func(ctx context.Context, ref string) bool) Option {
	return func(c *config) error { c.local = fn; return nil }
}

// WithStored says which layer blobs of ref (digests) are committed to the
// node's content store, and whether that is every one. With it, a fetcher
// lists them in its lease as they land (checked every 200 ms), and marks
// the lease fetched once every byte is in and every layer stored, as a
// blob's bytes are counted before its commit; without it, no layer is
// listed (waiters wait for the whole image) and the mark comes with the
// last byte.
func WithStored(fn func(ctx context.Context, ref string) (layers []string, all bool)) Option {
	return func(c *config) error { c.stored = fn; return nil }
}

// WithLogger sets the logger; default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("WithLogger(nil): leave the option out")
		}
		c.logger = l
		return nil
	}
}

// Gate orders one node's pulls against the fleet's. Safe for concurrent use.
type Gate struct {
	leases    typedcoord.LeaseInterface
	namespace string
	identity  string
	cfg       config
	http      *http.Client

	mu       sync.Mutex
	lastSwep time.Time
}

// New makes a gate over the leases of namespace, as node identity (the
// Node's name: it is what other nodes see as the fetcher).
func New(leases typedcoord.LeasesGetter, namespace, identity string, opts ...Option) (*Gate, error) {
	if leases == nil || namespace == "" || identity == "" {
		return nil, fmt.Errorf("fetchgate: a lease client, a namespace and an identity are needed (got namespace %q, identity %q)", namespace, identity)
	}
	c := config{
		concurrency: DefaultConcurrency, leaseDuration: DefaultLeaseDuration, maxWait: DefaultMaxWait,
		minProgress: DefaultMinProgress, unpackGrace: DefaultUnpackGrace, retain: DefaultRetain,
		mirrorTimeout: 2 * time.Second, logger: slog.Default(),
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("fetchgate: %w", err)
		}
	}
	if c.outageBound == 0 {
		c.outageBound = c.leaseDuration
	}
	c.renewEvery = max(c.leaseDuration/3, 300*time.Millisecond)
	return &Gate{leases: leases.Leases(namespace), namespace: namespace, identity: identity, cfg: c,
		http: &http.Client{Timeout: c.mirrorTimeout}}, nil
}

// Fetch runs pull once its turn comes: at once where this node fetches
// from upstream (it holds a lease, the image is local, no mirror is
// named or answers), after another node's fetch where one is under way.
// note is told, in a line a person reads, why the node waits or does not.
// Fetch calls pull at most once and returns its error; it returns without
// calling pull only when ctx ends. Every failure of the coordination
// itself ends in pulling, never in an error.
func (g *Gate) Fetch(ctx context.Context, ref string, note func(string), pull Pull) error {
	if note == nil {
		note = func(string) {}
	}
	dg, ok := digestOf(ref)
	if !ok {
		return pull(ctx, noProgress, nil)
	}
	if g.cfg.local != nil && g.cfg.local(ctx, ref) {
		return pull(ctx, noProgress, nil)
	}
	if reason := g.noMirror(ctx, ref); reason != "" {
		g.cfg.logger.Info("fetching from upstream without waiting for other nodes", "ref", ref, "reason", reason)
		note("fetching from upstream: " + reason)
		return pull(ctx, noProgress, nil)
	}
	g.sweep(ctx)
	turn, err := g.wait(ctx, dg, ref, note)
	if err != nil {
		return err // ctx ended
	}
	switch {
	case turn.held != nil:
		note("fetching " + short(dg) + " from upstream for the fleet (lease " + g.namespace + "/" + turn.held.Name + ")")
		return g.hold(ctx, ref, turn.held, pull)
	case turn.follow != nil:
		note("pulling through the mirror: as " + kubelease.Holder(turn.follow) + " fetches " + short(dg) + " from upstream, each layer once it has it")
		return g.follow(ctx, dg, ref, turn.follow, note, pull)
	case turn.fetchedBy != "":
		note("pulling through the mirror: " + turn.fetchedBy + " fetched " + short(dg))
	default:
		g.cfg.logger.Warn("fetching from upstream after all", "ref", ref, "reason", turn.fallback)
		note("fetching from upstream: " + turn.fallback)
	}
	return pull(ctx, noProgress, nil)
}

func noProgress(int64, int64) {}

// noMirror says why waiting for a peer would bring nothing: no mirror is
// named for the reference, or none answers. "" when one answers.
func (g *Gate) noMirror(ctx context.Context, ref string) string {
	if g.cfg.mirrors == nil {
		return ""
	}
	hosts, err := g.cfg.mirrors(ctx, ref)
	if err != nil {
		// Unreadable hosts configuration: the pull reads it as containerd
		// would; waiting may still pay.
		return ""
	}
	if len(hosts) == 0 {
		return "no mirror is configured for its registry (containerd's hosts configuration)"
	}
	var last error
	for _, h := range hosts {
		if last = g.answers(ctx, h); last == nil {
			return ""
		}
	}
	return fmt.Sprintf("no mirror answers (%v)", last)
}

// answers asks a mirror for its API root: any HTTP answer counts, as
// containerd's pull would go on to it.
func (g *Gate) answers(ctx context.Context, host string) error {
	u := strings.TrimSuffix(host, "/") + "/v2/"
	if !strings.Contains(host, "://") {
		u = "https://" + u
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.mirrorTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("mirror %s: %w", host, err)
	}
	resp, err := g.http.Do(req)
	if err != nil {
		return fmt.Errorf("mirror %s: %w", host, err)
	}
	resp.Body.Close()
	return nil
}

// digestOf is the digest a reference names (repo@sha256:…).
func digestOf(ref string) (string, bool) {
	i := strings.LastIndexByte(ref, '@')
	if i < 0 {
		return "", false
	}
	dg := ref[i+1:]
	algo, hex, ok := strings.Cut(dg, ":")
	if !ok || algo != "sha256" || len(hex) != 64 {
		return "", false
	}
	return dg, true
}

func short(dg string) string {
	if len(dg) > 19 {
		return dg[:19] + "…"
	}
	return dg
}
