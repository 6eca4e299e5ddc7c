package conn

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/opencontainers/go-digest"
)

// ErrTampered marks a record whose target is not the digest its name says.
var ErrTampered = errors.New("tampered pin record")

// Tampered reports whether a record named repo@sha256:X points elsewhere.
// Every part refuses such a record: a pull does not reuse it, a run does
// not start it, and it is no pin.
func Tampered(img images.Image) bool {
	_, d, ok := strings.Cut(img.Name, "@")
	return ok && d != img.Target.Digest.String()
}

// TamperedError says that the record name points at target instead of the
// image its name says; every refusal of such a record says it alike.
func TamperedError(name string, target digest.Digest) error {
	return fmt.Errorf("%w: %s points at %s, not the image its name says; it was changed outside gpupin and is never used: gpupin unpin or gpupin gc removes it, then provision again",
		ErrTampered, name, target)
}
