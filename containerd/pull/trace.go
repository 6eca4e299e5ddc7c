package pull

import (
	"context"
	"log/slog"
	"time"
)

// The unpack's trace says when each layer's fetch, extraction and commit
// began and ended, and why a layer fell to the daemon, for diagnosing a pull
// (docs/benchmarks.md). It goes through log/slog's default logger, as the
// package's warnings do, at debug level: the package reads no environment
// for it. The CLI shows it under --log-level debug, or with
// GPUPIN_UNPACK_TRACE set.

// traceStart is what a trace's "at" counts from: the process's start, so
// the layers of one pull, and of pulls at once, line up.
var traceStart = time.Now()

// trace logs one step of layer l's unpack at debug level, with args
// (slog's key-value pairs) after the layer's index and the time.
func trace(ctx context.Context, l *layer, msg string, args ...any) {
	lg := slog.Default()
	if !lg.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := append([]any{"layer", l.i, "digest", l.desc.Digest, "at", time.Since(traceStart).Round(time.Millisecond)}, args...)
	lg.DebugContext(ctx, "unpack: "+msg, attrs...)
}
