package pull

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/userns"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"
)

// How a pull unpacks, and why.
//
// containerd's own unpacker (client.Pull WithPullUnpack) fetches a layer
// into the content store and only then has the daemon's diff service read
// it back, decompress it and write its files; on one large gzip layer the
// download and the decompression follow each other. gpupin's pipeline
// (unpacker below) downloads every layer once and extracts it from the
// bytes as they arrive, in this process, into the snapshot the daemon
// prepared: download, decompression and file creation overlap, and no byte
// is read back. Where layers are extracted in parallel, one extracted so
// is not stored in the content store unless WithKeepLayers says so
// (direct.go); the rest are, as containerd stores them. It
// needs what a node's gpupin has: root, the host's view of containerd's
// snapshot directories, and the overlayfs snapshotter. Where any is
// missing (gpupin in a container without the host's /var/lib/containerd,
// another snapshotter, an encrypted layer) a layer is applied by the
// daemon's diff service from the content store instead, as containerd
// would. As root on overlayfs, layers are extracted in parallel, each into
// a snapshot without its parent, and committed in order: with containerd
// ≥ 2.2, whose overlayfs snapshotter can rebase a snapshot onto its parent
// at commit ("rebase" capability), by that commit; below it, by moving
// the layer's directory into a snapshot prepared on its parent
// (rehome.go). Otherwise (not root, "serial", "daemon" below 2.2) one
// after another.
//
// A Strategy, handed in by the Puller's maker (WithStrategy; the CLI
// reads it from GPUPIN_UNPACK), selects another way, for benchmarks and
// for diagnosing a node:
//
//	Parallel   ("")            gpupin's pipeline, parallel where it can be (the default)
//	Serial     ("serial")      gpupin's pipeline, one layer at a time
//	Daemon     ("daemon")      gpupin's pipeline, every layer applied by the daemon's diff service
//	Containerd ("containerd")  containerd's unpacker, one layer at a time
//
// Each makes the root filesystem containerd's own pull makes, attribute by
// attribute (TestUnpackMatchesCtrPull). containerd's unpacker with its
// parallel unpack is not offered: it makes a directory that a layer writes
// into without naming it 0755 and root-owned (it extracts without the
// parent layers underneath), so /tmp loses its sticky bit; gpupin's
// parallel extraction gives such directories their parents' attributes
// at commit (parents.go).
type Strategy string

// The strategies.
const (
	Parallel   Strategy = ""
	Serial     Strategy = "serial"
	Daemon     Strategy = "daemon"
	Containerd Strategy = "containerd"
)

// ParseStrategy reads a strategy's name; empty is the default.
func ParseStrategy(s string) (Strategy, error) {
	switch st := Strategy(s); st {
	case Parallel, Serial, Daemon, Containerd:
		return st, nil
	}
	return "", fmt.Errorf("unpack strategy %q: want serial, daemon or containerd (or unset)", s)
}

// EnvUnpack is the environment variable the CLI reads a Strategy from.
const EnvUnpack = "GPUPIN_UNPACK"

// errWrongDiffID is a layer whose files are not those its config names:
// the same bytes give the same answer, so nothing of it is worth keeping.
var errWrongDiffID = errors.New("wrong diff ID")

// fallbacks counts the layers whose extraction here failed, other than
// by their stream being dropped, and which the daemon then applied, for
// tests.
var fallbacks atomic.Int64

// unpackLayers bounds the layers downloaded and extracted at once.
const unpackLayers = 4

type unpackStrategy struct {
	containerd bool // containerd's unpacker
	parallel   bool // extract layers at once, commit in order
	// rehome: parallel on a snapshotter that cannot rebase; each layer's
	// files are moved into a snapshot prepared on its parent (rehome.go).
	rehome bool
	local  bool // extract in this process where the snapshot allows it
}

func (s unpackStrategy) String() string {
	var b strings.Builder
	if s.containerd {
		b.WriteString("containerd unpacker")
	} else {
		b.WriteString("gpupin pipeline")
		if s.local {
			b.WriteString(", streamed extraction")
		} else {
			b.WriteString(", daemon apply")
		}
	}
	if s.parallel {
		b.WriteString(", parallel")
		if s.rehome {
			b.WriteString(" (moved onto the parent at commit)")
		}
	}
	return b.String()
}

// strategy is the Puller's Strategy on what the snapshotter can do.
func (r *Puller) strategy(ctx context.Context) unpackStrategy {
	mode := r.mode
	caps, err := r.conn.Client.GetSnapshotterCapabilities(ctx, r.conn.Snapshotter)
	if err != nil {
		// Unknown capabilities: nothing is assumed of the snapshotter.
		caps = nil
	}
	// Overlay's rebase only: a layer extracted without its parent is
	// committed onto it, and its whiteouts and missing parent directories
	// are made as overlayfs reads them (erofs says rebase too).
	rebase := r.conn.Snapshotter == "overlayfs" && slices.Contains(caps, snapshots.RebaseCap)
	s := unpackStrategy{
		containerd: mode == Containerd,
		parallel:   rebase && (mode == Parallel || mode == Daemon),
		// Extraction here writes files as their owners and, on overlayfs,
		// makes whiteout devices: it needs root outside a user namespace.
		local: mode != Daemon && r.conn.Snapshotter == "overlayfs" && os.Geteuid() == 0 && !userns.RunningInUserNS(),
	}
	// Without rebase (containerd below 2.2) a layer extracted ahead is
	// moved into place by this process: it needs what local extraction
	// needs, the host's view of the snapshots included.
	if !rebase && r.conn.Snapshotter == "overlayfs" && s.local && mode == Parallel {
		s.parallel, s.rehome = true, true
	}
	return s
}

// pullOpts are the options that make client.Pull unpack as s says.
func (r *Puller) unpackOpts(s unpackStrategy, u *unpacker) []client.RemoteOpt {
	if s.containerd {
		return []client.RemoteOpt{client.WithPullUnpack, client.WithImageHandlerWrapper(u.labelled)}
	}
	return []client.RemoteOpt{client.WithImageHandlerWrapper(func(h images.Handler) images.Handler { return u.wrap(u.labelled(h)) })}
}

// unpacker is gpupin's pipeline for one pull: a handler wrapper that takes
// the layers out of containerd's fetch and, when the config is in, fetches
// and unpacks them.
type unpacker struct {
	r *Puller
	// What the pipeline asks of containerd, held from the Puller's
	// connection when the pull begins.
	content     content.Store
	snapshots   snapshots.Snapshotter
	snapshotter string // its name, for the labels and leases that name it
	leases      leases.Manager
	diff        diff.Applier
	strategy    unpackStrategy
	resolver    remotes.Resolver
	name        string // what the resolver fetches
	source      source // the label every blob it stores gets
	tracker     *tracker
	pending     atomic.Int64
	// keep stores every layer's blob: asked for (WithKeepLayers), or the
	// pull retries one that failed, whose next attempt should resume.
	keep bool
	// stored turns direct downloads off for the pull's later layers, once
	// an extraction here failed for a reason other than its stream: the
	// same reason would make each of them a second download.
	stored atomic.Bool
	// zstd is the pull's share of the zstd decoders' budget, claimed by
	// its zstd layers before they start (parallel unpack).
	zstd *semaphore.Weighted
	// await is PullOptions.AwaitLayer (nil: none).
	await func(context.Context, ocispec.Descriptor) error
}

func (r *Puller) newUnpacker(ctx context.Context, s unpackStrategy, res remotes.Resolver, name, ref string, t *tracker, keep bool, await func(context.Context, ocispec.Descriptor) error) *unpacker {
	c := r.conn.Client
	return &unpacker{r: r, content: r.store(ctx), snapshots: c.SnapshotService(r.conn.Snapshotter),
		snapshotter: r.conn.Snapshotter, leases: c.LeasesService(), diff: c.DiffService(),
		strategy: s, resolver: res, name: name, source: newSource(ref), tracker: t, keep: keep, zstd: semaphore.NewWeighted(zstdWindowBudget),
		await: await}
}

// wrap takes a manifest's layers out of its children, so that containerd's
// fetch does not download them, and unpacks them once the config, which
// holds their diff IDs, has been fetched. The manifest's labels (its
// content's references to the layers) are set before this sees them.
func (u *unpacker) wrap(h images.Handler) images.Handler {
	var mu sync.Mutex
	queued := map[digest.Digest][]ocispec.Descriptor{}
	return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		children, err := h.Handle(ctx, desc)
		if err != nil {
			return children, err
		}
		switch {
		case images.IsManifestType(desc.MediaType):
			var layers, rest []ocispec.Descriptor
			for _, c := range children {
				if images.IsLayerType(c.MediaType) {
					layers = append(layers, c)
				} else {
					rest = append(rest, c)
				}
			}
			if len(layers) == 0 {
				return children, nil
			}
			mu.Lock()
			for _, c := range rest {
				if images.IsConfigType(c.MediaType) {
					queued[c.Digest] = layers
				}
			}
			mu.Unlock()
			return rest, nil
		case images.IsConfigType(desc.MediaType):
			mu.Lock()
			layers := queued[desc.Digest]
			delete(queued, desc.Digest)
			mu.Unlock()
			if len(layers) > 0 {
				if err := u.unpack(ctx, desc, layers); err != nil {
					return nil, err
				}
			}
		}
		return children, nil
	})
}

// awaitLayer waits, where the pull was given a wait, until desc may be
// fetched.
func (u *unpacker) awaitLayer(ctx context.Context, desc ocispec.Descriptor) error {
	if u.await == nil {
		return nil
	}
	if err := u.await(ctx, desc); err != nil {
		return fmt.Errorf("layer %s: waiting for its turn: %w", desc.Digest, err)
	}
	return nil
}

// layer is one layer's unpacking.
type layer struct {
	i       int
	desc    ocispec.Descriptor
	diffID  digest.Digest
	chainID digest.Digest
	parent  digest.Digest // "" for the first
	labels  map[string]string

	key    string // the active snapshot, "" when none (exists, or done)
	mounts []mount.Mount
	exists bool // the snapshot was there already

	stream   *stream
	zstd     *zstdSlot // its claim on the pull's zstd decoders, nil when none
	direct   bool      // downloaded to its stream alone, not stored (direct.go)
	fetcher  remotes.Fetcher
	started  bool          // its download was started
	fetched  chan struct{} // closed when the download ended
	fetchErr error
	// discarded says the download verified the blob and did not store it;
	// set before fetched is closed, and cleared by the extraction once it
	// fetched the blob again for the daemon.
	discarded bool
	ready     chan struct{} // closed when extracted (or failed)
	err       error
	// committed is closed once its snapshot is committed (parallel
	// unpack); parentCommitted is its parent's, nil for the first layer.
	committed       chan struct{}
	parentCommitted <-chan struct{}
	// implicit: the parent directories its parallel extraction made
	// without its parent underneath (parents.go).
	implicit *implicitDirs
	// onParent: not extracted ahead (rehome without a view of its
	// snapshot); the daemon applies it onto its parent at its turn.
	onParent bool
}

func (u *unpacker) unpack(ctx context.Context, config ocispec.Descriptor, descs []ocispec.Descriptor) (retErr error) {
	cs := u.content
	raw, err := content.ReadBlob(ctx, cs, config)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var cfg struct {
		RootFS ocispec.RootFS `json:"rootfs"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("config %s: %w", config.Digest, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(descs) {
		return fmt.Errorf("config %s names %d diff IDs for %d layers", config.Digest, len(cfg.RootFS.DiffIDs), len(descs))
	}
	fetcher, err := u.resolver.Fetcher(ctx, u.name)
	if err != nil {
		return fmt.Errorf("fetcher: %w", err)
	}
	chain := identity.ChainIDs(slices.Clone(cfg.RootFS.DiffIDs))
	layers := make([]*layer, len(descs))
	for i, d := range descs {
		l := &layer{i: i, desc: d, diffID: cfg.RootFS.DiffIDs[i], chainID: chain[i], fetcher: fetcher,
			fetched: make(chan struct{}), ready: make(chan struct{}), committed: make(chan struct{})}
		if i > 0 {
			l.parent = chain[i-1]
			l.parentCommitted = layers[i-1].committed
		}
		// As containerd's unpacker labels them: inherited annotations
		// (never a uid/gid mapping from an untrusted manifest), the chain.
		l.labels = snapshots.FilterInheritedLabels(d.Annotations)
		if l.labels == nil {
			l.labels = map[string]string{}
		}
		delete(l.labels, snapshots.LabelSnapshotUIDMapping)
		delete(l.labels, snapshots.LabelSnapshotGIDMapping)
		l.labels[snapshots.LabelSnapshotRef] = l.chainID.String()
		l.labels[snapshots.LabelSnapshotDiffID] = l.diffID.String()
		if i > 0 {
			l.labels["containerd.io/snapshot/parent-chain-id"] = l.parent.String()
		}
		layers[i] = l
		u.tracker.observe(ctx, d)
	}

	if u.strategy.local {
		// Writeback beside the extraction (durable.go); the last kick
		// starts what is left while the probe runs.
		stop := u.r.flush.every(syncEvery)
		defer u.r.flush.kick()
		defer stop()
	}
	ctx, cancel := context.WithCancel(ctx)
	sn := u.snapshots
	var wg sync.WaitGroup
	defer func() {
		// On failure nothing half-made stays: extraction snapshots go
		// (downloads into the store keep what they wrote, for keepPartial;
		// a direct download stops with the context).
		cancel()
		for _, l := range layers {
			if l.stream != nil {
				l.stream.detach() // a download waiting on a reader that is gone goes on, or stops
			}
		}
		wg.Wait()
		for _, l := range layers {
			if l.key != "" {
				sn.Remove(context.WithoutCancel(ctx), l.key)
			}
		}
	}()

	// Downloads: every layer whose snapshot is missing, unpackLayers at a
	// time, in order, each into its stream when it has one (and into the
	// store, unless direct).
	dlSem := semaphore.NewWeighted(unpackLayers)
	startFetch := func(l *layer) {
		l.started = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(l.fetched)
			if err := u.awaitLayer(ctx, l.desc); err != nil {
				l.fetchErr = err
				if l.stream != nil {
					l.stream.finish(err)
				}
				return
			}
			if err := dlSem.Acquire(ctx, 1); err != nil {
				l.fetchErr = err
				if l.stream != nil {
					l.stream.finish(err)
				}
				return
			}
			defer dlSem.Release(1)
			trace(ctx, l, "fetch start")
			l.fetchErr = u.fetchLayer(ctx, cs, fetcher, l)
			trace(ctx, l, "fetched", "err", l.fetchErr)
			if l.stream != nil {
				l.stream.finish(l.fetchErr)
			}
		}()
	}

	if u.strategy.parallel {
		return u.unpackParallel(ctx, &wg, sn, config, layers, startFetch)
	}
	return u.unpackSerial(ctx, sn, config, layers, startFetch)
}

// unpackParallel prepares every layer's snapshot without a parent,
// extracts them at once, and commits them in order onto their parents.
func (u *unpacker) unpackParallel(ctx context.Context, wg *sync.WaitGroup, sn snapshots.Snapshotter, config ocispec.Descriptor, layers []*layer, startFetch func(*layer)) error {
	exSem := semaphore.NewWeighted(unpackLayers)
	for _, l := range layers {
		if err := exSem.Acquire(ctx, 1); err != nil {
			return err
		}
		if err := u.prepare(ctx, sn, l, ""); err != nil {
			exSem.Release(1)
			return err
		}
		if l.exists {
			exSem.Release(1)
			close(l.ready)
			u.labelStored(ctx, l)
			continue
		}
		if u.strategy.local {
			l.stream = newStream(&u.pending, true)
			_, _, ok := localTarget(l.mounts, l.i > 0)
			if ok && l.desc.MediaType == ocispec.MediaTypeImageLayerZstd {
				slot, err := claimZstd(ctx, u.zstd)
				if err != nil {
					exSem.Release(1)
					return err
				}
				l.zstd = slot
			}
			// Its stream is read from the first byte: it can be all the
			// download writes to.
			l.direct = ok && streamable(l.desc.MediaType) && !u.keep && !u.stored.Load()
		}
		if u.strategy.rehome && l.i > 0 {
			if _, _, ok := localTarget(l.mounts, true); !ok {
				// Out of this process's reach (no host view of the
				// snapshots): nothing could move it, so it is fetched
				// into the store and applied once, onto its parent, at
				// its turn (rehome).
				l.onParent = true
				if l.stream != nil {
					l.stream.detach()
					l.stream = nil
				}
				l.zstd.release()
				l.direct = false
				startFetch(l)
				exSem.Release(1)
				close(l.ready)
				continue
			}
		}
		startFetch(l)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(l.ready)
			// Its slot goes before it waits for its parent's commit (the
			// daemon's apply): the commits come after every layer has
			// started, and the layers waiting would hold every slot.
			release := sync.OnceFunc(func() { exSem.Release(1) })
			defer release()
			l.err = u.extract(ctx, l, l.i > 0, release)
			trace(ctx, l, "extracted", "err", l.err)
		}()
	}
	for _, l := range layers {
		select {
		case <-l.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		if l.err != nil {
			return l.err
		}
		if l.implicit != nil && len(l.implicit.dirs) > 0 {
			start := time.Now()
			// Its parent is committed now: what mkparent would have
			// copied from it is there to copy.
			parents, err := u.parentLayers(ctx, sn, l.parent)
			if err != nil {
				return fmt.Errorf("layer %d (%s): %w", l.i, l.desc.Digest, err)
			}
			if err := l.implicit.copyParentAttrs(parents); err != nil {
				return fmt.Errorf("layer %d (%s): %w", l.i, l.desc.Digest, err)
			}
			trace(ctx, l, "directories it does not name given their parents' attributes", "dirs", len(l.implicit.dirs), "took", time.Since(start))
		}
		if u.strategy.rehome && l.parent != "" && !l.exists {
			if err := u.rehome(ctx, sn, l); err != nil {
				return err
			}
		}
		if err := u.commit(ctx, sn, l, !u.strategy.rehome); err != nil {
			return err
		}
		close(l.committed)
		trace(ctx, l, "committed")
	}
	return u.finish(ctx, config, layers)
}

// unpackSerial extracts each layer onto its committed parent. Downloads
// run ahead; a layer whose download began before its turn is applied from
// what its stream still holds, or else from the content store.
func (u *unpacker) unpackSerial(ctx context.Context, sn snapshots.Snapshotter, config ocispec.Descriptor, layers []*layer, startFetch func(*layer)) error {
	// Which layers need fetching is known only per layer (a snapshot may
	// exist); ahead of its turn a layer's snapshot is not prepared, so its
	// existence is checked by name.
	for _, l := range layers {
		if _, err := sn.Stat(ctx, l.chainID.String()); err == nil {
			continue
		}
		if u.strategy.local {
			l.stream = newStream(&u.pending, l.i == 0)
		}
		startFetch(l)
	}
	for _, l := range layers {
		if err := u.prepare(ctx, sn, l, l.parent); err != nil {
			return err
		}
		if l.exists {
			if l.stream != nil {
				l.stream.detach()
			}
			u.labelStored(ctx, l)
			continue
		}
		if !l.started {
			// Its snapshot was there at the check and is gone now: it
			// still needs its blob.
			startFetch(l)
		}
		if err := u.extract(ctx, l, false, func() {}); err != nil {
			return err
		}
		if err := u.commit(ctx, sn, l, false); err != nil {
			return err
		}
	}
	return u.finish(ctx, config, layers)
}

// prepare makes l's extraction snapshot on parent, or finds its chain
// there already (and keeps it, under the pull's lease).
func (u *unpacker) prepare(ctx context.Context, sn snapshots.Snapshotter, l *layer, parent digest.Digest) error {
	var err error
	for try := 0; try < 3; try++ {
		l.key = fmt.Sprintf(snapshots.UnpackKeyFormat, rand.Text(), l.chainID)
		p := ""
		if parent != "" {
			p = parent.String()
		}
		l.mounts, err = sn.Prepare(ctx, l.key, p, snapshots.WithLabels(l.labels))
		if err == nil {
			return nil
		}
		l.key = ""
		if !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("prepare the snapshot of layer %d (%s): %w", l.i, l.desc.Digest, err)
		}
		if _, serr := sn.Stat(ctx, l.chainID.String()); serr == nil {
			// containerd skips such a layer without a reference to its
			// snapshot, which a collection may then remove under the pull;
			// the pull's lease holds it instead.
			l.exists = true
			if id, ok := leases.FromContext(ctx); ok {
				u.leases.AddResource(ctx, leases.Lease{ID: id},
					leases.Resource{ID: l.chainID.String(), Type: "snapshots/" + u.snapshotter})
			}
			return nil
		}
	}
	return fmt.Errorf("prepare the snapshot of layer %d (%s): %w", l.i, l.desc.Digest, err)
}

// fetch downloads desc into the content store, teeing into s (nil: none),
// and commits it labelled with its source (source.go); a blob the store
// has already gets the label added. It is remotes.Fetch, with the tee and
// the label: the same ingest reference, so an interrupted download
// resumes (and is then not streamed).
func (u *unpacker) fetch(ctx context.Context, cs content.Store, fetcher remotes.Fetcher, desc ocispec.Descriptor, s *stream) error {
	ref := remotes.MakeRefKey(ctx, desc)
	cw, err := content.OpenWriter(ctx, cs, content.WithRef(ref), content.WithDescriptor(desc))
	if err != nil {
		if errdefs.IsAlreadyExists(err) {
			if s != nil {
				s.detach() // applied from the store
			}
			return u.source.addTo(ctx, cs, desc)
		}
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	defer cw.Close()
	ws, err := cw.Status()
	if err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	if err := checkLayerDesc(desc); err != nil {
		return err
	}
	if ws.Offset > 0 && s != nil {
		s.detach() // the stream would miss the first bytes
	}
	if ws.Offset == desc.Size {
		if err := cw.Commit(ctx, desc.Size, desc.Digest, u.source.commitOpts()...); err != nil {
			if errdefs.IsAlreadyExists(err) {
				return u.source.addTo(ctx, cs, desc)
			}
			return fmt.Errorf("blob %s: commit: %w", desc.Digest, err)
		}
		return nil
	}
	var tee func(io.Reader) io.Reader
	if s != nil {
		tee = func(r io.Reader) io.Reader { return newTee(r, s) }
	}
	return copyResuming(ctx, cs, ref, cw, func() (io.ReadCloser, error) { return fetcher.Fetch(ctx, desc) }, tee, desc, u.source.commitOpts()...)
}

// checkLayerDesc refuses a layer whose manifest gives it no size: nothing
// could tell its body complete.
func checkLayerDesc(desc ocispec.Descriptor) error {
	if desc.Size <= 0 {
		return fmt.Errorf("layer %s reports a size of %d: %w", desc.Digest, desc.Size, errdefs.ErrInvalidArgument)
	}
	return nil
}

// extract writes l's files into its active snapshot: from its stream where
// it has one and this process can reach the snapshot, else by the daemon's
// diff service once the blob is in the content store. parallelChild says
// the snapshot has no parent yet though the layer has one (rebased or
// moved onto it at commit): its whiteouts must become overlay whiteouts. release gives up
// the caller's extraction slot, before a wait for the parent's commit.
func (u *unpacker) extract(ctx context.Context, l *layer, parallelChild bool, release func()) error {
	if l.stream != nil {
		if dir, opts, ok := localTarget(l.mounts, parallelChild); ok && streamable(l.desc.MediaType) && l.stream.attach() {
			u.r.flush.see(dir)
			if parallelChild {
				l.implicit = newImplicitDirs(dir)
				opts = append(opts, archive.WithFilter(l.implicit.filter))
			}
			got, err := applyStream(ctx, dir, l.stream, l.zstd, u.r.gzip, opts)
			l.zstd.release() // the decoder is done: the pull's next layer may start
			if err == nil && l.direct {
				// The download checks the blob once it has all of it: it
				// must not be cut off by the stream going.
				_, err = io.Copy(io.Discard, l.stream)
			}
			l.stream.detach()
			// The download's outcome first: a failed download fails the
			// extraction that read from it, and says why.
			if ferr := l.waitFetched(ctx); ferr != nil {
				return ferr
			}
			if err == nil {
				return l.checkDiffID(got)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Not extracted here (the stream dropped as the download
			// resumed, no zstd decoder free, an overlay attribute this
			// process may not set): what was written goes, and the daemon
			// applies the layer from the verified content, as containerd
			// would. Bytes that are wrong fail there too, with the
			// daemon's reason.
			trace(ctx, l, "extraction here failed; the daemon applies it", "err", err)
			l.implicit = nil
			if !errors.Is(err, errDetached) { // a blob found in the store is applied from there, as it should be
				fallbacks.Add(1)
				u.stored.Store(true)
			}
			if err := clearDir(dir); err != nil {
				return fmt.Errorf("extract layer %d (%s): %w", l.i, l.desc.Digest, err)
			}
		} else {
			l.stream.detach()
		}
	}
	l.zstd.release()
	if err := l.waitFetched(ctx); err != nil {
		return err
	}
	mounts := l.mounts
	if parallelChild {
		// The daemon's extraction finds missing parent directories in
		// the lower layers its overlay mount names: it waits for the
		// parent's commit, and is given the chain underneath.
		release()
		select {
		case <-l.parentCommitted:
		case <-ctx.Done():
			return ctx.Err()
		}
		parents, err := u.parentLayers(ctx, u.snapshots, l.parent)
		if err != nil {
			return fmt.Errorf("apply layer %d (%s): %w", l.i, l.desc.Digest, err)
		}
		mounts = bindToOverlay(mounts, parents)
	}
	return u.daemonApply(ctx, l, mounts)
}

// daemonApply has the daemon's diff service apply l's blob, from the
// content store, to mounts, as containerd's unpacker does.
func (u *unpacker) daemonApply(ctx context.Context, l *layer, mounts []mount.Mount) error {
	if l.discarded {
		// The whole blob had come, been verified and gone before this
		// extraction gave up: fetched again, for the daemon.
		u.tracker.restart(l.desc.Digest.String())
		if err := u.fetch(ctx, u.content, l.fetcher, l.desc, nil); err != nil {
			return fmt.Errorf("extract layer %d (%s): %w", l.i, l.desc.Digest, err)
		}
		l.discarded = false
	}
	d, err := u.diff.Apply(ctx, l.desc, mounts)
	if err != nil {
		return fmt.Errorf("apply layer %d (%s %s): %w", l.i, l.desc.MediaType, l.desc.Digest, err)
	}
	return l.checkDiffID(d.Digest)
}

// labelStored adds this pull's source to the blob of a layer whose
// snapshot was there already, if the store has it: nothing fetches it. A
// label that could not be added costs a mirror one blob, not the pull.
func (u *unpacker) labelStored(ctx context.Context, l *layer) {
	cs := u.content
	if _, err := cs.Info(ctx, l.desc.Digest); err != nil {
		return // not stored: nothing for a mirror to serve
	}
	if err := u.source.addTo(ctx, cs, l.desc); err != nil {
		slog.WarnContext(ctx, "label a stored layer with its source", "digest", l.desc.Digest, "err", err)
	}
}

// waitFetched waits for l's download and returns its error.
func (l *layer) waitFetched(ctx context.Context) error {
	select {
	case <-l.fetched:
		return l.fetchErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkDiffID holds an extraction's digest to the one the config names.
func (l *layer) checkDiffID(got digest.Digest) error {
	if got != l.diffID {
		return fmt.Errorf("%w %s calculated on extraction of %s, the config says %s", errWrongDiffID, got, l.desc.Digest, l.diffID)
	}
	return nil
}

// commit commits l's snapshot (onto its parent, when it was extracted
// without one) and records its uncompressed digest, as containerd does.
func (u *unpacker) commit(ctx context.Context, sn snapshots.Snapshotter, l *layer, rebase bool) error {
	if l.exists {
		return nil
	}
	opts := []snapshots.Opt{snapshots.WithLabels(l.labels)}
	if rebase && l.parent != "" {
		opts = append(opts, snapshots.WithParent(l.parent.String()))
	}
	if err := sn.Commit(ctx, l.chainID.String(), l.key, opts...); err != nil {
		if !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("commit the snapshot of layer %d (%s): %w", l.i, l.desc.Digest, err)
		}
		// Committed meanwhile by another pull: ours goes.
		sn.Remove(ctx, l.key)
	}
	l.key = ""
	if l.discarded {
		return nil // no blob to label
	}
	info := content.Info{Digest: l.desc.Digest, Labels: map[string]string{labels.LabelUncompressed: l.diffID.String()}}
	if _, err := u.content.Update(ctx, info, "labels."+labels.LabelUncompressed); err != nil {
		return fmt.Errorf("label layer %s: %w", l.desc.Digest, err)
	}
	return nil
}

// finish points the config at the top snapshot, which keeps the chain
// from the collector while the image is.
func (u *unpacker) finish(ctx context.Context, config ocispec.Descriptor, layers []*layer) error {
	key := "containerd.io/gc.ref.snapshot." + u.snapshotter
	info := content.Info{Digest: config.Digest, Labels: map[string]string{key: layers[len(layers)-1].chainID.String()}}
	if _, err := u.content.Update(ctx, info, "labels."+key); err != nil {
		return fmt.Errorf("label config %s: %w", config.Digest, err)
	}
	return nil
}
