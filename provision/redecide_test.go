package provision_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/memrt"
	"github.com/gpupin/gpupin/provision"
)

// meanwhile is a registry that, once it has answered, lets another
// provision pin: after this one read its pins, before it takes the key's
// lock.
type meanwhile struct {
	memrt.Resolver
	then func()
}

func (m meanwhile) ResolveReference(ctx context.Context, ref images.Reference) (*images.Set, error) {
	set, err := m.Resolver.ResolveReference(ctx, ref)
	m.then()
	return set, err
}

// Under the key's lock the pins are read again and the decision made
// again: a pin another provision made meanwhile answers the want, or
// holds the key against it; either way nothing is pulled.
func TestRedecideUnderTheLockSimulated(t *testing.T) {
	facts := h100("580.82.07", "13.0")
	set := memrt.EngineSet(demoRef, "demo", "1.0")
	pinOf := func(source string) containerd.Pin {
		v := set.Variants[0]
		return containerd.Pin{Key: "demo:1.0", Ref: v.Ref, Digest: v.Digest, Variant: v.Variant, Source: source,
			Override: "auto", Node: facts.Fingerprint(), Simulated: facts.Simulated, ProbedAt: time.Now()}
	}
	cases := []struct {
		name   string
		source string // of the pin made meanwhile
		state  provision.State
		detail string
		class  error
	}{
		{"the same source: ready", demoRef, provision.Ready, "by another provision meanwhile", nil},
		{"another source: conflict", "registry.test/other/demo:1.0", provision.Failed, "registry.test/other/demo:1.0", provision.ErrConflict},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := memrt.New()
			res := meanwhile{Resolver: memrt.Resolver{demoRef: set}, then: func() { m.AddPin(pinOf(tc.source)) }}
			p := memProvisioner(t, m, nil, facts, provision.WithResolver(res))
			st := p.Provision(t.Context(), provision.Want{Ref: demoRef})
			if st.State != tc.state || !strings.Contains(st.Detail, tc.detail) {
				t.Fatalf("provision: %s; want %s saying %q", st, tc.state, tc.detail)
			}
			if tc.class != nil && !errors.Is(st.Err, tc.class) {
				t.Fatalf("err %v; want %v", st.Err, tc.class)
			}
			if got := m.Pulled(); len(got) != 0 {
				t.Fatalf("pulled %v; want nothing, the decision under the lock being made on the new pin", got)
			}
		})
	}
}
