// Package pull is gpupin's pull engine: it fetches an image by digest and
// unpacks it into containerd's snapshots, never writing over a record that
// is there already (a pin, perhaps).
//
// Start with Puller.Pull (pull.go); unpack.go says how layers are unpacked
// and why, and each step has its file: the download (stream.go, direct.go,
// source.go, announce.go), the extraction (decompress.go, extract.go, parents.go,
// rehome.go), keeping what a failed pull fetched (partial.go), fetching
// ahead (prefetch.go), and syncing the files to disk (durable.go).
package pull

import (
	"context"

	"github.com/gpupin/gpupin/containerd/conn"
)

// Puller pulls into one containerd namespace.
type Puller struct {
	conn *conn.Conn
	// keepLayers stores every layer blob a pull downloads, even one
	// extracted here (direct.go).
	keepLayers bool
	mode       Strategy // how layers are unpacked (unpack.go)
	flush      *flusher
	decompress DecompressOptions
	gzip       string // the gzip command layers are decompressed with; "": Go's (decompress.go)
}

// Option configures a Puller.
type Option func(*Puller)

// WithKeepLayers stores every layer blob a pull downloads in the content
// store, as containerd's own pull does, for ctr export, a push from the
// node, or a pull that resumes. Otherwise a layer this process extracted
// while it downloaded, and verified, is not stored: a node runs from its
// snapshots, and storing the blob costs the daemon a write, a hash and an
// fsync of every byte, and the node the disk (direct.go).
func WithKeepLayers(keep bool) Option { return func(r *Puller) { r.keepLayers = keep } }

// WithStrategy sets how layers are unpacked (default Parallel). It is the
// caller's choice, not the environment's: the CLI reads EnvUnpack.
func WithStrategy(s Strategy) Option { return func(r *Puller) { r.mode = s } }

// New is a Puller over c.
func New(c *conn.Conn, opts ...Option) *Puller {
	r := &Puller{conn: c, flush: newFlusher()}
	for _, o := range opts {
		o(r)
	}
	r.gzip = FindDecompressors(r.decompress).Gzip
	return r
}

// Close lets go of the snapshots' directory the flusher holds open.
func (r *Puller) Close() { r.flush.close() }

// Sync puts what pulls extracted here so far on disk: a pin says the image
// was proved, so its files are on disk before it is written (durable.go).
func (r *Puller) Sync(ctx context.Context) error { return r.flush.sync(ctx) }
