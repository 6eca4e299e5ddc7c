package provision_test

import (
	"errors"
	"testing"

	"github.com/gpupin/gpupin/probe"
	"github.com/gpupin/gpupin/provision"
)

// probeFailure is the *probe.Failure beneath a failed status, reached as a
// caller reaches it: through Status.Err, classed ErrAllFailed.
func probeFailure(t *testing.T, st provision.Status) *probe.Failure {
	t.Helper()
	var f *probe.Failure
	if st.State != provision.Failed || !errors.Is(st.Err, provision.ErrAllFailed) || !errors.As(st.Err, &f) {
		t.Fatalf("%s; want failed, ErrAllFailed over a *probe.Failure (err %v)", st, st.Err)
	}
	return f
}
