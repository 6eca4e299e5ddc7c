package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reworded says a full disk in words of its own, keeping the errno.
type reworded struct{ err error }

func (r reworded) Error() string { return "the layer store is out of room" }
func (r reworded) Unwrap() error { return r.err }

func TestWorthKeeping(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"registry cut mid-body", fmt.Errorf("pull x: read blob: %w", io.ErrUnexpectedEOF), true},
		{"connection reset", fmt.Errorf("pull x: %w", &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}), true},
		{"registry timeout", fmt.Errorf("pull x: %w", context.DeadlineExceeded), true},
		{"daemon unavailable", fmt.Errorf("pull x: %w", errdefs.ErrUnavailable), true},
		{"daemon error of another kind", fmt.Errorf("pull x: write: input/output error: %w", errdefs.ErrUnknown), true},

		{"disk full here", fmt.Errorf("pull x: %w", &os.PathError{Op: "write", Path: "/snap/1/fs/f", Err: syscall.ENOSPC}), false},
		{"disk full here, reworded", fmt.Errorf("pull x: %w", reworded{syscall.ENOSPC}), false},
		{"quota here", fmt.Errorf("pull x: %w", &os.PathError{Op: "write", Path: "/snap/1/fs/f", Err: syscall.EDQUOT}), false},
		// The client's conversion of a gRPC status of code Unknown.
		{"disk full in the daemon", fmt.Errorf("pull x: failed to copy: write /var/lib/containerd/ingest/1/data: no space left on device: %w", errdefs.ErrUnknown), false},
		{"disk full in the daemon, raw status", fmt.Errorf("pull x: %w", status.Error(codes.Unknown, "write /var/lib/containerd/ingest/1/data: disk quota exceeded")), false},
		{"daemon out of resources", fmt.Errorf("pull x: %w", errdefs.ErrResourceExhausted), false},
		{"wrong digest", fmt.Errorf("pull x: %w", errdefs.ErrFailedPrecondition), false},
		{"wrong size", fmt.Errorf("pull x: %w", errdefs.ErrInvalidArgument), false},
		{"gone", fmt.Errorf("pull x: %w", errdefs.ErrNotFound), false},
		{"data loss", fmt.Errorf("pull x: %w", errdefs.ErrDataLoss), false},
		{"wrong diff ID", fmt.Errorf("pull x: layer 1: %w", errWrongDiffID), false},
		{"wrong media type", fmt.Errorf("pull x: %w", ErrMediaType), false},
		{"body not of its media type", errors.New("pull x: children: invalid desc sha256:1: media-type: expected manifest but found index (application/vnd.oci.image.manifest.v1+json)"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := worthKeeping(tc.err); got != tc.want {
				t.Errorf("worthKeeping(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
