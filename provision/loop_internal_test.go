package provision

import (
	"context"
	"testing"
)

// NewLoop leaves the Provisioner as it was, and a provision's states reach
// the observers the provisioner was made with and the one its caller's
// context carries, and no other loop's.
func TestLoopsDoNotChangeTheirProvisioner(t *testing.T) {
	var seen []string
	p, err := New(nil, WithOnState(func(Status) { seen = append(seen, "provisioner") }))
	if err != nil {
		t.Fatal(err)
	}
	before := len(p.opts.OnState)
	NewLoop(p, LoopOptions{})
	NewLoop(p, LoopOptions{})
	if got := len(p.opts.OnState); got != before {
		t.Fatalf("two loops made p's observers %d, want %d", got, before)
	}
	own := withObserver(context.Background(), func(Status) { seen = append(seen, "own") })
	withObserver(context.Background(), func(Status) { seen = append(seen, "other") })
	p.emit(own, Status{State: Pulling})
	if want := []string{"provisioner", "own"}; len(seen) != len(want) || seen[0] != want[0] || seen[1] != want[1] {
		t.Fatalf("observers called: %v, want %v", seen, want)
	}
}
