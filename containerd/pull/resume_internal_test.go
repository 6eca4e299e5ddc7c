package pull

import (
	"fmt"
	"io"
	"testing"

	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/registry"
)

func TestResumeRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"416 from the registry", fmt.Errorf("failed open: %w", remoteerrors.ErrUnexpectedStatus{Status: "416 Requested Range Not Satisfiable", StatusCode: 416}), true},
		{"a mirror's 404 first", fmt.Errorf("could not fetch content descriptor: %w", errdefs.ErrNotFound), true},
		{"registry died mid-body", fmt.Errorf("short read: %w", io.ErrUnexpectedEOF), false},
		{"registry stalled", fmt.Errorf("GET x: %w", registry.ErrStalled), false},
		{"another status", fmt.Errorf("failed open: %w", remoteerrors.ErrUnexpectedStatus{Status: "503 Service Unavailable", StatusCode: 503}), false},
		{"wrong digest", fmt.Errorf("commit: %w", errdefs.ErrFailedPrecondition), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resumeRefused(tc.err); got != tc.want {
				t.Errorf("resumeRefused(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
