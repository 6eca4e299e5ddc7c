// Package kubelease holds the small readers of a coordination.k8s.io/v1
// Lease, and the cancellable sleep, that fetchgate and canary share.
package kubelease

import (
	"context"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
)

// Holder is the lease's holder identity, "" when none.
func Holder(l *coordv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// Renewed is the lease's renew time, zero when none.
func Renewed(l *coordv1.Lease) time.Time {
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}

// Acquired is the lease's acquire time, zero when none.
func Acquired(l *coordv1.Lease) time.Time {
	if l.Spec.AcquireTime == nil {
		return time.Time{}
	}
	return l.Spec.AcquireTime.Time
}

// Sleep waits d or until ctx ends; its error is ctx's. No wait for d <= 0.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
