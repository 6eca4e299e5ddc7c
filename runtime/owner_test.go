package runtime

import (
	"os"
	"testing"
	"time"
)

func TestOwnerLabels(t *testing.T) {
	self := ownerOf(os.Getpid())
	foreign := "1:12345:pid:[1]"
	for _, tc := range []struct {
		label string
		alive bool
	}{
		{self, true},
		{"", false},
		{"garbage", false},
		{"999999999:1", false},          // the old pid:start form, of no process
		{"1:0", false},                  // pid 1 exists, but started at another time
		{foreign, true},                 // another pid namespace: cannot be seen, so alive
		{"999999999:1:" + pidNS, false}, // this namespace, gone
	} {
		if got := ownerAlive(tc.label); got != tc.alive {
			t.Errorf("ownerAlive(%q) = %v, want %v", tc.label, got, tc.alive)
		}
	}
	if staleForeign(foreign, time.Now()) || !staleForeign(foreign, time.Now().Add(-25*time.Hour)) || staleForeign(self, time.Now().Add(-48*time.Hour)) {
		t.Error("staleForeign: only another namespace's leftovers older than a lease are stale")
	}
}
