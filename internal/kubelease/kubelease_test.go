package kubelease

import (
	"context"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestReaders(t *testing.T) {
	id := "node-a"
	at := metav1.NewMicroTime(time.Unix(1000, 0))
	for _, c := range []struct {
		name              string
		spec              coordv1.LeaseSpec
		holder            string
		renewed, acquired time.Time
	}{
		{"empty", coordv1.LeaseSpec{}, "", time.Time{}, time.Time{}},
		{"held", coordv1.LeaseSpec{HolderIdentity: &id, RenewTime: &at}, id, at.Time, time.Time{}},
		{"acquired only", coordv1.LeaseSpec{AcquireTime: &at}, "", time.Time{}, at.Time},
	} {
		l := &coordv1.Lease{Spec: c.spec}
		if got := Holder(l); got != c.holder {
			t.Errorf("%s: Holder %q, want %q", c.name, got, c.holder)
		}
		if got := Renewed(l); !got.Equal(c.renewed) {
			t.Errorf("%s: Renewed %v, want %v", c.name, got, c.renewed)
		}
		if got := Acquired(l); !got.Equal(c.acquired) {
			t.Errorf("%s: Acquired %v, want %v", c.name, got, c.acquired)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, d := range []time.Duration{0, time.Hour} {
		if err := Sleep(ctx, d); err != context.Canceled {
			t.Errorf("Sleep(cancelled, %s) = %v, want context.Canceled", d, err)
		}
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep(1ms) = %v", err)
	}
}
