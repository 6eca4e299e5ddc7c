package pull

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// copyResuming is content.Copy into cw (the ingest ref of cs) from open's
// body, wrapped by wrap where not nil, resuming where an interrupted
// download left cw. A resume asks the registry for a range (bytes=N-),
// and one that refuses it (go-containerregistry's registry answers 416 to
// an open range; proxies and CDNs differ) would fail every later pull of
// the blob too, since the partial ingest stays. So where a resume fails,
// the ingest is aborted and the blob downloaded once from its start.
func copyResuming(ctx context.Context, cs content.Store, ref string, cw content.Writer, open func() (io.ReadCloser, error), wrap func(io.Reader) io.Reader, desc ocispec.Descriptor, opts ...content.Opt) error {
	ws, err := cw.Status()
	if err != nil {
		return fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	err = copyFrom(ctx, cw, open, wrap, desc, opts...)
	if err == nil || ws.Offset == 0 || ctx.Err() != nil {
		return err
	}
	log.G(ctx).WithError(err).WithField("digest", desc.Digest).WithField("offset", ws.Offset).
		Info("resuming the blob failed: downloading it again from the start")
	// Truncate would not do: the writer's status, which Copy seeks by,
	// reads the daemon's offset until the next write. The writer holds
	// the ref's lock while open: closed first (the caller's Close after
	// is a no-op on a closed stream).
	cw.Close()
	if aerr := cs.Abort(ctx, ref); aerr != nil {
		return errors.Join(err, fmt.Errorf("blob %s: drop the partial download: %w", desc.Digest, aerr))
	}
	fresh, oerr := content.OpenWriter(ctx, cs, content.WithRef(ref), content.WithDescriptor(desc))
	if oerr != nil {
		return errors.Join(err, fmt.Errorf("blob %s: %w", desc.Digest, oerr))
	}
	defer fresh.Close()
	return copyFrom(ctx, fresh, open, wrap, desc, opts...)
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
