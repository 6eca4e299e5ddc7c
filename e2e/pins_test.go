package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpupin/gpupin/internal/sandbox"
	"github.com/gpupin/gpupin/internal/testenv"
)

// pinView is what `gpupin pins --json` says of a pin, the part read here.
type pinView struct {
	Key              string   `json:"key"`
	Ref              string   `json:"ref"`
	Simulated        bool     `json:"simulated"`
	SimulatedChecks  []string `json:"simulated_checks"`
	VerdictTruncated bool     `json:"verdict_truncated"`
	VerdictError     string   `json:"verdict_error"`
}

// A pin proved on simulated facts says so wherever it is shown, with the
// checks that were simulated: the `simulated:` lines of provision and
// probe, and `gpupin pins` in text and JSON. A verdict whose label was cut
// at containerd's limit (here, a node of 160 GPUs) is said to be cut, not
// shown as a pin without simulated checks.
func TestCLISimulatedPinsSayWhatWasSimulated(t *testing.T) {
	testenv.NeedProbeBinaries(t)
	glibc, err := sandbox.GlibcLayer()
	if err != nil {
		t.Fatal(err)
	}
	// The cuda probe runs for real in it, in its simulated mode.
	distroless, err := sandbox.BareImage(sandbox.ImageSpec{Layers: []v1.Layer{glibc}, Env: []string{"PATH=/usr/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	pins := func(t *testing.T, c *cli) []pinView {
		t.Helper()
		out, code := c.run("pins", "--json")
		var views []pinView
		if err := json.Unmarshal([]byte(out), &views); err != nil || code != 0 || len(views) != 1 {
			t.Fatalf("pins --json exit %d, %v:\n%s", code, err, out)
		}
		return views
	}

	t.Run("checks listed", func(t *testing.T) {
		reg := testenv.Registry(t)
		ref := publishOne(t, reg, "distroless", distroless)
		c := newCLI(t, reg)
		provOut, code := c.run("provision", ref)
		if code != 0 {
			t.Fatalf("provision exit %d:\n%s", code, provOut)
		}
		v := pins(t, c)[0]
		if !v.Simulated || len(v.SimulatedChecks) < 2 || v.VerdictTruncated || v.VerdictError != "" {
			t.Fatalf("pins --json: %+v; want a simulated pin with its checks", v)
		}
		if !strings.Contains(strings.Join(v.SimulatedChecks, "\n"), "PTX saxpy") {
			t.Errorf("simulated checks %q lack the cuda probe's", v.SimulatedChecks)
		}
		out, code := c.run("pins")
		want := fmt.Sprintf("proved, SIMULATED (%d checks simulated: %s)\n", len(v.SimulatedChecks), strings.Join(v.SimulatedChecks, "; "))
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("pins exit %d, lacks %q:\n%s", code, want, out)
		}
		probeOut, code := c.run("probe", v.Ref)
		if code != 0 || !strings.Contains(probeOut, fmt.Sprintf("PASSED (SIMULATED: %d checks simulated, the rest checked for real)", len(v.SimulatedChecks))) {
			t.Errorf("probe exit %d:\n%s", code, probeOut)
		}
		// The label keeps each check to 120 bytes; the text lines have it whole.
		for _, check := range v.SimulatedChecks {
			line := "  simulated: " + strings.TrimSuffix(check, "...")
			if !strings.Contains(provOut, line) {
				t.Errorf("provision output lacks %q:\n%s", line, provOut)
			}
			if !strings.Contains(probeOut, line) {
				t.Errorf("probe output lacks %q:\n%s", line, probeOut)
			}
		}
	})

	t.Run("verdict label cut", func(t *testing.T) {
		reg := testenv.Registry(t)
		ref := publishOne(t, reg, "wide", distroless)
		c := newCLI(t, reg)
		// 160 GPUs: the compact verdict (about 30 bytes a device) is more
		// than containerd's 4096-byte label, and the runtime cuts it.
		var gpus []string
		for i := range 160 {
			gpus = append(gpus, fmt.Sprintf(`{"index":%d,"uuid":"GPU-wide-%03d","name":"NVIDIA H100 80GB HBM3","cc":"9.0"}`, i, i))
		}
		node := `{"driver":"580.82.07","cuda":"13.0","gpus":[` + strings.Join(gpus, ",") + `]}`
		if err := os.WriteFile(filepath.Join(c.dir, "node.json"), []byte(node), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := c.run("provision", ref); code != 0 {
			t.Fatalf("provision exit %d:\n%s", code, out)
		}
		v := pins(t, c)[0]
		const lost = "the verdict label was cut at containerd's label limit ("
		if !v.Simulated || !v.VerdictTruncated || len(v.SimulatedChecks) != 0 || !strings.HasPrefix(v.VerdictError, lost) ||
			!strings.HasSuffix(v.VerdictError, "bytes kept): which checks were simulated is lost") {
			t.Fatalf("pins --json: %+v; want the cut verdict said", v)
		}
		out, code := c.run("pins")
		if code != 0 || !strings.Contains(out, "proved, SIMULATED ("+lost) {
			t.Errorf("pins exit %d, does not say the verdict was cut:\n%s", code, out)
		}
	})
}
