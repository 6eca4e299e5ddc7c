package containerd

import (
	"context"

	"github.com/gpupin/gpupin/containerd/pull"
)

// The pull engine's types and errors (package pull).
type (
	Pulled        = pull.Pulled
	PullOptions   = pull.PullOptions
	Progress      = pull.Progress
	LayerStorage  = pull.LayerStorage
	Decompressors = pull.Decompressors
	// DecompressOptions turn off gzip commands pulls would run (WithDecompress).
	DecompressOptions = pull.DecompressOptions
	// UnpackStrategy is how pulls unpack (WithUnpack).
	UnpackStrategy = pull.Strategy
)

// ParseUnpack reads an unpack strategy's name: "" (gpupin's parallel
// pipeline, the default), "serial", "daemon" or "containerd".
func ParseUnpack(s string) (UnpackStrategy, error) { return pull.ParseStrategy(s) }

// EnvUnpack is where the CLI reads WithUnpack's strategy from; the
// library reads no environment.
const EnvUnpack = pull.EnvUnpack

var (
	ErrMediaType        = pull.ErrMediaType
	ErrNoRoomToPrefetch = pull.ErrNoRoomToPrefetch
)

// EnvDisableIgzip and EnvDisablePigz are where the CLI reads
// WithDecompress's options from, as containerd's daemon reads its own; the
// library reads no environment.
const (
	EnvDisableIgzip = pull.EnvDisableIgzip
	EnvDisablePigz  = pull.EnvDisablePigz
)

// FindDecompressors looks the commands up as a pull under o does.
func FindDecompressors(o DecompressOptions) Decompressors { return pull.FindDecompressors(o) }

// Pull fetches ref (a repo@sha256 reference) and unpacks it, never
// writing over an existing record of that name (pull.Puller.Pull).
func (r *Runtime) Pull(ctx context.Context, ref string, opts PullOptions) (Pulled, error) {
	return r.pull.Pull(ctx, ref, opts)
}

// Prefetch fetches and unpacks ref ahead of its Pull, when the disk has
// room (pull.Puller.Prefetch).
func (r *Runtime) Prefetch(ctx context.Context, ref string, opts PullOptions, maxBytes int64) (release func(), err error) {
	return r.pull.Prefetch(ctx, ref, opts, maxBytes)
}

// LayerStorage says whether and why pulls here store layer blobs.
func (r *Runtime) LayerStorage(ctx context.Context) (LayerStorage, error) {
	return r.pull.LayerStorage(ctx)
}
