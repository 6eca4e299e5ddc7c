package provision_test

import (
	"errors"
	"testing"

	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/internal/testenv"
	"github.com/gpupin/gpupin/node"
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

// memProvisioner is a Provisioner over m and sets on the simulated H100,
// with stand-in probe programs (the probe never runs them: m prints).
func memProvisioner(t *testing.T, m *memrt.Runtime, sets memrt.Resolver, facts *node.Facts, extra ...provision.Option) *provision.Provisioner {
	t.Helper()
	opts := append([]provision.Option{provision.WithNode(node.Static{Facts: facts}), provision.WithResolver(sets),
		provision.WithOverrides(provision.NoOverrides())}, memrt.Staged(t)...)
	return testenv.Provisioner(t, m, append(opts, extra...)...)
}
