package images_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/images"
)

// ResolveReference is Resolve without the parse: the same set, named as the
// user wrote the reference, and the same registry reads.
func TestResolveReferenceIsResolve(t *testing.T) {
	f := startFixture(t)
	ctx := context.Background()
	// The tag-and-digest form normalises to the digest alone: Set.Ref must
	// still be the reference as it was written.
	tagged, err := f.res.Resolve(ctx, f.engine)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{f.engine, f.derived, f.custom, f.engine + "@" + tagged.Digest} {
		t.Run(ref, func(t *testing.T) {
			f.reg.Reset()
			want, err := f.res.Resolve(ctx, ref)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			byString := f.reg.Count("manifest", "GET")
			pr, err := images.ParseReference(ref)
			if err != nil {
				t.Fatal(err)
			}
			f.reg.Reset()
			got, err := f.res.ResolveReference(ctx, pr)
			if err != nil {
				t.Fatalf("ResolveReference: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("ResolveReference: %+v\nResolve: %+v", got, want)
			}
			if got.Ref != ref {
				t.Errorf("Set.Ref %q, want the reference as written, %q", got.Ref, ref)
			}
			if n := f.reg.Count("manifest", "GET"); n != byString || n == 0 {
				t.Errorf("ResolveReference read %d manifests, Resolve %d", n, byString)
			}
		})
	}
}

// A Reference that was never parsed is refused before any registry is read.
func TestResolveReferenceRefusesTheZeroReference(t *testing.T) {
	_, err := (&images.Resolver{}).ResolveReference(context.Background(), images.Reference{})
	if err == nil || !strings.Contains(err.Error(), "empty image reference") {
		t.Fatalf("error %v, want an empty image reference", err)
	}
}
