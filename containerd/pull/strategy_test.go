package pull_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/containerd/pull"
	"github.com/gpupin/gpupin/internal/testenv"
)

// TestParseStrategy: each strategy's name reads as it, empty as the
// default, and any other name is refused with an error that names it and
// the names there are.
func TestParseStrategy(t *testing.T) {
	for _, c := range []struct {
		name string
		want pull.Strategy
		err  bool
	}{
		{"", pull.Parallel, false},
		{"serial", pull.Serial, false},
		{"daemon", pull.Daemon, false},
		{"containerd", pull.Containerd, false},
		{"parallel", "", true},
		{"Serial", "", true},
		{" serial", "", true},
		{"bogus", "", true},
	} {
		got, err := pull.ParseStrategy(c.name)
		if c.err {
			if err == nil {
				t.Errorf("ParseStrategy(%q) = %q, want an error", c.name, got)
				continue
			}
			for _, w := range []string{`"` + c.name + `"`, "serial", "daemon", "containerd"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ParseStrategy(%q): error %q does not say %s", c.name, err, w)
				}
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseStrategy(%q) = %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

// TestConnectRefusesAnUnknownStrategy: a Strategy made by a conversion,
// not ParseStrategy, is refused when the Runtime is made, before any
// socket is tried.
func TestConnectRefusesAnUnknownStrategy(t *testing.T) {
	_, err := containerd.Connect(context.Background(), filepath.Join(t.TempDir(), "no.sock"), containerd.WithUnpack("bogus"))
	if err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Fatalf("Connect with strategy bogus: %v; want the strategy refused", err)
	}
}

// TestStrategyFromEnvironmentReachesThePuller: the package reads no
// environment, but the tests' runtime (internal/testenv), as the CLI,
// reads GPUPIN_UNPACK and hands the strategy in; an option handed in
// picks it without the environment.
func TestStrategyFromEnvironmentReachesThePuller(t *testing.T) {
	ctx := context.Background()
	unpack := func(rt *containerd.Runtime) string {
		t.Helper()
		ls, err := rt.LayerStorage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ls.Unpack
	}
	if got := unpack(testenv.Runtime(t, containerd.WithUnpack(pull.Containerd))); got != "containerd unpacker" {
		t.Errorf("WithUnpack(Containerd): unpack %q, want containerd's unpacker", got)
	}
	t.Setenv(containerd.EnvUnpack, "containerd")
	if got := unpack(testenv.Runtime(t)); got != "containerd unpacker" {
		t.Errorf("%s=containerd: unpack %q, want containerd's unpacker", containerd.EnvUnpack, got)
	}
	t.Setenv(containerd.EnvUnpack, "serial")
	if got := unpack(testenv.Runtime(t)); strings.Contains(got, "parallel") || strings.Contains(got, "containerd") {
		t.Errorf("%s=serial: unpack %q, want gpupin's pipeline one layer at a time", containerd.EnvUnpack, got)
	}
}
