package pull

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
)

// Layers that are not stored.
//
// A node runs containers from snapshots; a layer's compressed blob is read
// once, to make its snapshot, and never again unless someone exports or
// pushes the image from the node. Storing it anyway makes the daemon
// receive, write, hash and fsync every compressed byte beside the
// extraction, about a fifth of two cores and as many bytes of writeback
// as the image is large (docs/benchmarks.md), and keeps gigabytes per
// variant on the node's disk. So a layer that this process extracts while
// it downloads goes to its stream alone, and the download verifies its
// size and digest itself, as the content store's commit would: nothing of
// the layer is committed before both that and the extraction's diff ID
// agree. It is what CRI's discard_unpacked_layers leaves, without ever
// writing the blob. WithKeepLayers stores them all, as containerd does; so
// does a pull that retries one that failed (storeLayers), since a layer not
// stored cannot resume.
//
// Only where layers are extracted in parallel (unpackParallel): there a
// stream is read from its first byte. One after another (GPUPIN_UNPACK=
// serial, or not root), a layer downloaded ahead of its turn may outrun what its stream can
// hold, and it needs the store to land in.
//
// Where the layer cannot be extracted here after all (its stream dropped),
// it is downloaded again into the content store, for the daemon to apply.

// fetchLayer downloads l: to its stream alone where l.direct, else into
// the content store (teeing into the stream where it has one).
func (u *unpacker) fetchLayer(ctx context.Context, cs content.Store, fetcher remotes.Fetcher, l *layer) error {
	if !l.direct {
		return u.fetch(ctx, cs, fetcher, l.desc, l.stream)
	}
	// The store is asked first: a blob it has (a prefetch's, another
	// image's) is applied from there, held by this pull's lease as fetch
	// takes it, and part of one that an earlier attempt left resumes.
	// (A blob only another namespace holds is downloaded: the store links
	// it only for a writer, and a writer opened and aborted races the
	// daemon's own close of it.)
	if _, err := cs.Info(ctx, l.desc.Digest); err == nil {
		return u.fetch(ctx, cs, fetcher, l.desc, l.stream)
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("layer %s: %w", l.desc.Digest, err)
	}
	if st, err := cs.Status(ctx, remotes.MakeRefKey(ctx, l.desc)); err == nil && st.Offset > 0 {
		return u.fetch(ctx, cs, fetcher, l.desc, l.stream)
	}
	err := u.fetchDirect(ctx, fetcher, l)
	if !errors.Is(err, errDetached) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The extraction gave the stream up: the daemon applies the layer, from
	// the store.
	u.tracker.restart(l.desc.Digest.String())
	return u.fetch(ctx, cs, fetcher, l.desc, nil)
}

// fetchDirect downloads l's blob into its stream and checks what came
// against the descriptor; errDetached once the stream is dropped.
func (u *unpacker) fetchDirect(ctx context.Context, fetcher remotes.Fetcher, l *layer) error {
	desc := l.desc
	if err := checkLayerDesc(desc); err != nil {
		return err
	}
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("layer %s: %w: %v", desc.Digest, errdefs.ErrInvalidArgument, err)
	}
	rc, err := fetcher.Fetch(ctx, desc)
	if err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	v := desc.Digest.Verifier()
	// One byte past the size, to tell a longer body from the right one.
	body := &directBody{r: io.LimitReader(rc, desc.Size+1), s: l.stream, t: u.tracker, dg: desc.Digest.String()}
	n, err := io.Copy(v, body)
	switch {
	case err != nil:
		if errors.Is(err, errDetached) {
			return err
		}
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	// The same classes as the content store's commit: not worth a retry's
	// keep (partial.go).
	case n > desc.Size:
		return fmt.Errorf("layer %s: the registry sent more than its size in the manifest, %d bytes: %w", desc.Digest, desc.Size, errdefs.ErrFailedPrecondition)
	case n < desc.Size:
		return fmt.Errorf("layer %s: the registry sent %d bytes of its size in the manifest, %d: %w", desc.Digest, n, desc.Size, errdefs.ErrFailedPrecondition)
	case !v.Verified():
		return fmt.Errorf("layer %s: the bytes the registry sent have another digest: %w", desc.Digest, errdefs.ErrFailedPrecondition)
	}
	l.discarded = true
	return nil
}

// directBody copies a download into a stream, counts it for the pull's
// progress, and stops once the stream is dropped.
type directBody struct {
	r  io.Reader
	s  *stream
	t  *tracker
	dg string
}

func (b *directBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.s.Write(p[:n])
		b.t.read(b.dg, int64(n))
		if b.s.isDetached() {
			return n, errDetached
		}
	}
	return n, err
}
