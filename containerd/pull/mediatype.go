package pull

import (
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
)

// ErrMediaType marks a pull refused because the registry's answer is not
// the kind of manifest the caller was told it is (PullOptions.MediaType).
var ErrMediaType = errors.New("unexpected media type")

// manifestKind sorts a manifest media type into "index" (OCI index,
// Docker manifest list), "image" (OCI or Docker schema 2 image manifest)
// or "" (anything else). OCI and Docker types of one kind are one kind:
// what matters is whether the pull would follow an index's children.
func manifestKind(mt string) string {
	switch mt {
	case images.MediaTypeDockerSchema2ManifestList, "application/vnd.oci.image.index.v1+json":
		return "index"
	case images.MediaTypeDockerSchema2Manifest, "application/vnd.oci.image.manifest.v1+json":
		return "image"
	}
	return ""
}

// checkMediaType compares the media type a reference resolved to (got)
// with what the caller expected (want; "" checks nothing). An index entry
// typed as an image whose digest is an index would otherwise be pulled as
// an index, its first matching child unpacked and pinned: a nested index
// that resolution refuses, let in by the pull.
func checkMediaType(ref, want, got string) error {
	if want == "" {
		return nil
	}
	wk, gk := manifestKind(want), manifestKind(got)
	if wk == "" {
		return fmt.Errorf("pull %s: expected media type %q is neither an image manifest nor an index: %w", ref, want, ErrMediaType)
	}
	if gk == wk {
		return nil
	}
	what := map[string]string{"index": "an image index", "image": "an image manifest", "": "neither an image manifest nor an index"}
	return fmt.Errorf("pull %s: the registry answered with %s (%s) where %s (%s) was expected; refused before anything was fetched below it (nested indexes are not variants): %w",
		ref, what[gk], got, what[wk], want, ErrMediaType)
}
