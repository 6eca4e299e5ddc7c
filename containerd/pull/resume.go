package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// copyResuming is content.Copy into cw (the ingest ref of cs) from open's
// body, wrapped by wrap where not nil, resuming where an interrupted
// download left cw. A resume asks the registry for a range (bytes=N-),
// before the copy or when a body breaks off during it, and one that
// refuses the range (go-containerregistry's registry answers 416 to an
// open one; proxies and CDNs differ) would fail every later pull of the
// blob too, since the partial ingest stays. So where a copy with part of
// the blob in fails on a refused range, the ingest is dropped and the blob
// downloaded once more from its start. A registry that died mid-body is
// left alone: the next attempt resumes from what arrived.
func copyResuming(ctx context.Context, cs content.Store, ref string, cw content.Writer, open func() (io.ReadCloser, error), wrap func(io.Reader) io.Reader, desc ocispec.Descriptor, opts ...content.Opt) error {
	ws, err := cw.Status()
	if err != nil {
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	err = copyFrom(ctx, cw, open, wrap, desc, opts...)
	if err == nil || ctx.Err() != nil || !resumeRefused(err) {
		// A registry that died or stalled is retried by the next
		// attempt, which resumes: what arrived is kept.
		return err
	}
	offset := ws.Offset
	if st, serr := cs.Status(ctx, ref); serr == nil {
		offset = max(offset, st.Offset)
	}
	if offset == 0 {
		return err // nothing in: the same request again would fare the same
	}
	log.G(ctx).WithError(err).WithField("digest", desc.Digest).WithField("offset", offset).
		Info("the blob's download failed part-way: downloading it again from the start")
	// The writer holds the ref's lock while open: closed first (the
	// caller's Close after is a no-op on a closed stream). Truncate
	// would not do: the writer's status, which Copy seeks by, reads the
	// daemon's offset until the next write.
	cw.Close()
	fresh, oerr := restartIngest(ctx, cs, ref, desc)
	if oerr != nil {
		return errors.Join(err, fmt.Errorf("blob %s: %w", desc.Digest, oerr))
	}
	defer fresh.Close()
	return copyFrom(ctx, fresh, open, wrap, desc, opts...)
}

// restartIngest drops ref's partial download and opens a writer at its
// start. The daemon may still be closing the old writer (an abort then
// races its files: "directory not empty"), so the abort is tried a few
// times; where it still fails, the download goes to a ref of its own and
// the old ingest is left to the pull's lease.
func restartIngest(ctx context.Context, cs content.Store, ref string, desc ocispec.Descriptor) (content.Writer, error) {
	var aerr error
	for i := range 5 {
		if aerr = cs.Abort(ctx, ref); aerr == nil || errdefs.IsNotFound(aerr) {
			aerr = nil
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(i+1) * 100 * time.Millisecond):
		}
	}
	if aerr != nil {
		log.G(ctx).WithError(aerr).WithField("ref", ref).Info("partial download not dropped: downloading under another ref")
		ref += "-restart-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	w, err := content.OpenWriter(ctx, cs, content.WithRef(ref), content.WithDescriptor(desc))
	if err != nil {
		return nil, err
	}
	if st, err := w.Status(); err == nil && st.Offset > 0 {
		// Another download got in between: start it over under a ref
		// of its own.
		w.Close()
		return content.OpenWriter(ctx, cs, content.WithRef(ref+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)), content.WithDescriptor(desc))
	}
	return w, nil
}

// resumeRefused tells a refused range from a registry that failed: a 416,
// or a not-found (containerd's fetcher reports the first host's error, so
// a mirror's 404 hides the registry's 416 behind it). A dead or stalled
// registry, or wrong bytes, are none of these.
func resumeRefused(err error) bool {
	var st remoteerrors.ErrUnexpectedStatus
	if errors.As(err, &st) && st.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		return true
	}
	return errdefs.IsNotFound(err)
}

func copyFrom(ctx context.Context, cw content.Writer, open func() (io.ReadCloser, error), wrap func(io.Reader) io.Reader, desc ocispec.Descriptor, opts ...content.Opt) error {
	rc, err := open()
	if err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	var r io.Reader = rc
	if wrap != nil {
		r = wrap(rc)
	}
	if err := content.Copy(ctx, cw, r, desc.Size, desc.Digest, opts...); err != nil {
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	return nil
}
