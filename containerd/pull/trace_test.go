package pull

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// The unpack's trace goes through slog at debug level, whatever the
// environment says: the caller's logger decides whether it shows.
func TestTraceGoesThroughSlog(t *testing.T) {
	t.Setenv("GPUPIN_UNPACK_TRACE", "1") // read by the CLI only
	l := &layer{i: 3, desc: ocispec.Descriptor{Digest: digest.FromString("layer")}}
	for _, tc := range []struct {
		level slog.Level
		shown bool
	}{{slog.LevelInfo, false}, {slog.LevelDebug, true}} {
		var buf bytes.Buffer
		old := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level})))
		trace(context.Background(), l, "fetched", "err", nil)
		slog.SetDefault(old)
		out := buf.String()
		if !tc.shown {
			if out != "" {
				t.Errorf("at %s the trace printed %q", tc.level, out)
			}
			continue
		}
		for _, want := range []string{"level=DEBUG", `msg="unpack: fetched"`, "layer=3", "digest=" + l.desc.Digest.String(), "at=", "err=<nil>"} {
			if !strings.Contains(out, want) {
				t.Errorf("trace printed %q; want %s in it", out, want)
			}
		}
	}
}
