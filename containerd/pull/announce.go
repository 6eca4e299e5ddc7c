package pull

import (
	"context"
	"log/slog"
	"strconv"
	"strings"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/opencontainers/go-digest"
)

// Announcing what a pull stores.
//
// containerd 2.1 and later publish /content/create (ContentCreate: digest,
// size, media type) when a blob is committed; 1.x and 2.0 publish nothing.
// A peer-to-peer mirror that serves the node's content store (Spegel)
// advertises a blob stored after its start only on that event, so on an
// older daemon the layers a node has just pulled are served to no peer,
// and every node of a rollout goes upstream. Where the daemon does not
// publish it, gpupin publishes the same event for each blob it commits,
// through the daemon's event service (where shims publish their task
// events), so the mirror sees what a 2.1 daemon would have told it.

// ContentCreateTopic is the topic containerd 2.1+ publishes a commit on.
const ContentCreateTopic = "/content/create"

// DaemonAnnounces says whether a containerd of this version publishes a
// commit's ContentCreate itself (2.1 and later). An unreadable version
// counts as not: a second event for a blob only advertises it again,
// while a missing one costs every peer a fetch from upstream.
func DaemonAnnounces(version string) bool {
	major, rest, _ := strings.Cut(strings.TrimPrefix(version, "v"), ".")
	minor, _, _ := strings.Cut(rest, ".")
	ma, err := strconv.Atoi(major)
	if err != nil {
		return false
	}
	mi, err := strconv.Atoi(minor)
	if err != nil {
		return false
	}
	return ma > 2 || ma == 2 && mi >= 1
}

// announcing is a content store that publishes ContentCreate after each
// commit made through it that stored a blob.
type announcing struct {
	content.Store
	events events.Publisher
}

func (s announcing) Writer(ctx context.Context, opts ...content.WriterOpt) (content.Writer, error) {
	w, err := s.Store.Writer(ctx, opts...)
	if err != nil {
		return nil, err
	}
	var wo content.WriterOpts
	for _, o := range opts {
		if err := o(&wo); err != nil {
			return nil, err
		}
	}
	return &announcingWriter{Writer: w, events: s.events, mediaType: wo.Desc.MediaType}, nil
}

type announcingWriter struct {
	content.Writer
	events    events.Publisher
	mediaType string
}

func (w *announcingWriter) Commit(ctx context.Context, size int64, expected digest.Digest, opts ...content.Opt) error {
	// Read before the commit: the daemon's writer is closed by it.
	dgst := expected
	if dgst == "" {
		dgst = w.Writer.Digest()
	}
	if size <= 0 {
		if st, err := w.Writer.Status(); err == nil {
			size = st.Offset
		}
	}
	// AlreadyExists stored nothing, and containerd announces nothing for it.
	if err := w.Writer.Commit(ctx, size, expected, opts...); err != nil {
		return err
	}
	// The blob is stored: a lost event costs peers this blob from the
	// mirror, not the pull.
	if err := w.events.Publish(ctx, ContentCreateTopic, &eventstypes.ContentCreate{Digest: dgst.String(), Size: size, MediaType: w.mediaType}); err != nil {
		slog.WarnContext(ctx, "announce a stored blob to the node's mirror", "digest", dgst, "err", err)
	}
	return nil
}

// store is where a pull commits its blobs: the daemon's content store,
// announcing each commit where the daemon does not (asked at each pull: the
// daemon may have been upgraded under a running agent).
func (r *Puller) store(ctx context.Context) content.Store {
	c := r.conn.Client
	v, err := c.Version(ctx)
	if err == nil && DaemonAnnounces(v.Version) {
		return c.ContentStore()
	}
	return announcing{Store: c.ContentStore(), events: c.EventService()}
}
