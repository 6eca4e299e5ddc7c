package registry

import (
	"context"
	"io"
	"log/slog"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
)

// LogContext carries a containerd logger that follows slog's default
// level: containerd's resolver says "trying next host" at info for every
// mirror fallback, which is detail for a debug log, not for every user.
// Pulls pass their context through it too.
func LogContext(ctx context.Context) context.Context {
	l := logrus.New()
	l.SetOutput(log.L.Logger.Out)
	l.SetLevel(logrus.WarnLevel)
	if slog.Default().Enabled(ctx, slog.LevelDebug) {
		l.SetLevel(logrus.DebugLevel)
	}
	return log.WithLogger(ctx, logrus.NewEntry(l))
}

// quietResolver runs every call of a resolver under LogContext.
type quietResolver struct{ remotes.Resolver }

func (q quietResolver) Resolve(ctx context.Context, ref string) (string, ocispec.Descriptor, error) {
	return q.Resolver.Resolve(LogContext(ctx), ref)
}

func (q quietResolver) Fetcher(ctx context.Context, ref string) (remotes.Fetcher, error) {
	f, err := q.Resolver.Fetcher(LogContext(ctx), ref)
	if err != nil {
		return nil, err
	}
	return quietFetcher{f}, nil
}

type quietFetcher struct{ remotes.Fetcher }

func (q quietFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	return q.Fetcher.Fetch(LogContext(ctx), d)
}
