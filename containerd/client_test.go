package containerd_test

import (
	"context"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// An empty namespace (CONTAINERD_NAMESPACE= set but empty) keeps the
// default: containerd refuses every call made in namespace "".
func TestWithNamespaceEmptyKeepsTheDefault(t *testing.T) {
	d := testenv.Containerd(t)
	for _, tc := range []struct {
		give, want string
	}{
		{"", "gpupin"},
		{"elsewhere", "elsewhere"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			rt, err := containerd.Connect(context.Background(), d.Address, containerd.WithNamespace(tc.give))
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			if got := rt.Namespace(); got != tc.want {
				t.Errorf("Namespace() = %q, want %q", got, tc.want)
			}
			if _, err := rt.ListPins(context.Background()); err != nil {
				t.Errorf("ListPins in %q: %v", rt.Namespace(), err)
			}
		})
	}
}
