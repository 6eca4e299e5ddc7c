package runtime

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// CRIPinning says whether a containerd's CRI plugin reports images
// labelled io.cri-containerd.pinned=pinned as pinned, so that kubelet's
// image GC (and `crictl rmi --prune`) keeps them.
type CRIPinning struct {
	Version string `json:"version"` // the daemon's, as it reports it
	// Kept is true where the CRI plugin honours the label (2.x, and 1.7
	// with containerd#8867); false where it has no notion of pinned
	// images (1.6 as Debian ships it, 1.6.20).
	Kept bool   `json:"kept"`
	Note string `json:"note"`
}

// CRIPinningOf judges a containerd version string ("1.6.20~ds1",
// "v2.4.2", "2.4.2+unknown").
func CRIPinningOf(version string) CRIPinning {
	v := strings.TrimPrefix(version, "v")
	f := strings.FieldsFunc(v, func(r rune) bool { return r == '.' || r == '-' || r == '~' || r == '+' })
	major, minor := 0, 0
	if len(f) > 0 {
		major, _ = strconv.Atoi(f[0])
	}
	if len(f) > 1 {
		minor, _ = strconv.Atoi(f[1])
	}
	c := CRIPinning{Version: version}
	switch {
	case major >= 2:
		c.Kept = true
		c.Note = "its CRI plugin reports pins as pinned (crictl inspecti: pinned: true), so kubelet's image GC keeps them"
	case major == 1 && minor == 7:
		c.Kept = true
		c.Note = "its CRI plugin pins images by label from the 1.7 patch releases that have containerd#8867; check with crictl inspecti; gpupin restores a pin kubelet's image GC removes either way"
	default:
		c.Note = "its CRI plugin has no notion of pinned images: crictl inspecti shows no pinned, and kubelet's image GC or crictl rmi --prune may delete a pin; gpupin keeps the pin's content under a lease and restores the record (within the agent's sweep period), else proves it again"
	}
	return c
}

// CRIPinning asks the daemon its version and judges it.
func (r *Runtime) CRIPinning(ctx context.Context) (CRIPinning, error) {
	v, err := r.client.Version(ctx)
	if err != nil {
		return CRIPinning{}, fmt.Errorf("containerd version: %w", err)
	}
	return CRIPinningOf(v.Version), nil
}
