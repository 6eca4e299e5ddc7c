package conn

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
)

// WithLease runs fn under a lease that keeps what it fetches and creates
// until it returns; the lease is labelled so a sweep removes it if this
// process dies first.
func (c *Conn) WithLease(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx = c.Ctx(ctx)
	ls := c.Client.LeasesService()
	l, err := ls.Create(ctx, leases.WithRandomID(), leases.WithExpiration(LeaseTTL),
		leases.WithLabels(map[string]string{LabelManaged: "true", LabelOwner: Owner()}))
	if err != nil {
		return fmt.Errorf("create lease: %w", err)
	}
	// Synchronous: what this lease alone held is collected before the
	// caller goes on. Left to a later collection, it can vanish under the
	// next pull, which found it present and so did not unpack it again.
	defer Cleanup(ctx, func(ctx context.Context) error { return ls.Delete(ctx, l, leases.SynchronousDelete) })
	return fn(leases.WithLease(ctx, l.ID))
}

// LeaseTTL bounds a lease: what a process that vanished left under it goes
// after this long even if no sweep sees it.
const LeaseTTL = 24 * time.Hour
