package pins

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpupin/gpupin/containerd/conn"
)

// CRINamespace is the containerd namespace of the CRI plugin's images:
// what kubelet sees.
const CRINamespace = "k8s.io"

// How a CRIPinning was learnt.
const (
	// CRISeen: the CRI plugin was asked about an image record gpupin
	// labelled io.cri-containerd.pinned=pinned, and answered.
	CRISeen = "seen"
	// CRIJudged: judged from the daemon's version, as there was no such
	// record to ask about, or the CRI plugin does not serve.
	CRIJudged = "judged from the version"
)

// CRIPinning says whether a containerd's CRI plugin reports images
// labelled io.cri-containerd.pinned=pinned as pinned, so that kubelet's
// image GC (and `crictl rmi --prune`) keeps them.
type CRIPinning struct {
	Version string `json:"version"` // the daemon's, as it reports it
	// Kept is true where the CRI plugin honours the label (2.x, and 1.7
	// with containerd#8867); false where it has no notion of pinned
	// images (1.6 as Debian ships it, 1.6.20).
	Kept bool `json:"kept"`
	// How is CRISeen or CRIJudged: a 1.6 or 1.7 patch release may have
	// the label backported, which only asking shows.
	How string `json:"how"`
	// Image is the record the CRI plugin was asked about (CRISeen).
	Image string `json:"image,omitempty"`
	// Why says why it was judged rather than seen.
	Why  string `json:"why,omitempty"`
	Note string `json:"note"`
}

// The notes, by what is known.
const (
	notePinned    = "its CRI plugin reports pins as pinned (crictl inspecti: pinned: true), so kubelet's image GC keeps them"
	noteNotPinned = "its CRI plugin has no notion of pinned images: crictl inspecti shows no pinned, and kubelet's image GC or crictl rmi --prune may delete a pin; " +
		"gpupin keeps the pin's content under a lease and restores the record (within the agent's sweep period), else proves it again"
	note17 = "its CRI plugin pins images by label from the 1.7 patch releases that have containerd#8867; check with crictl inspecti; " +
		"gpupin restores a pin kubelet's image GC removes either way"
)

// CRIPinningOf judges a containerd version string ("1.6.20~ds1",
// "v2.4.2", "2.4.2+unknown"): the fallback of CRIPinning when the CRI
// plugin cannot be asked.
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
	c := CRIPinning{Version: version, How: CRIJudged}
	switch {
	case major >= 2:
		c.Kept, c.Note = true, notePinned
	case major == 1 && minor == 7:
		c.Kept, c.Note = true, note17
	default:
		c.Note = noteNotPinned
	}
	return c
}

// CRIPinning asks the daemon's CRI plugin, over containerd's own gRPC
// connection, whether it reports as pinned an image record gpupin labelled
// io.cri-containerd.pinned=pinned in CRINamespace (a pin's local name
// first): what kubelet's image GC will do with pins, as this very daemon
// does it. With no such record, or no CRI plugin serving, it falls back to
// judging the version (How says which). An error only when the daemon does
// not answer at all.
func (r *Store) CRIPinning(ctx context.Context) (CRIPinning, error) {
	v, err := r.conn.Client.Version(ctx)
	if err != nil {
		return CRIPinning{}, fmt.Errorf("containerd version: %w", err)
	}
	judged := CRIPinningOf(v.Version)
	name, err := r.criPinnedImage(ctx)
	if err != nil {
		judged.Why = err.Error()
		return judged, nil
	}
	if name == "" {
		judged.Why = "no image record in " + CRINamespace + " that gpupin labelled pinned, to ask the CRI plugin about"
		return judged, nil
	}
	pinned, err := r.criImagePinned(ctx, name)
	if err != nil {
		judged.Why = err.Error()
		return judged, nil
	}
	c := CRIPinning{Version: v.Version, Kept: pinned, How: CRISeen, Image: name, Note: noteNotPinned}
	if pinned {
		c.Note = notePinned
	}
	return c, nil
}

// criPinnedImage is a record in CRINamespace that gpupin made and labelled
// pinned: a local name (a tag, as pods name it) before a pin record; ""
// when there is none.
func (r *Store) criPinnedImage(ctx context.Context) (string, error) {
	ctx = namespaces.WithNamespace(ctx, CRINamespace)
	imgs, err := r.conn.Client.ImageService().List(ctx, fmt.Sprintf(`labels.%q==%q,labels.%q==%q`, LabelCRIPinned, "pinned", conn.LabelManaged, "true"))
	if err != nil {
		return "", fmt.Errorf("list pinned records in %s: %w", CRINamespace, err)
	}
	sort.Slice(imgs, func(i, j int) bool {
		li, lj := imgs[i].Labels[LabelLocal] != "", imgs[j].Labels[LabelLocal] != ""
		if li != lj {
			return li
		}
		return imgs[i].Name < imgs[j].Name
	})
	for _, img := range imgs {
		if !conn.Tampered(img) {
			return img.Name, nil
		}
	}
	return "", nil
}

// criImagePinned asks the CRI plugin (runtime.v1 ImageService) whether it
// reports the image pinned. The plugin learns of records from containerd's
// events, so one made a moment ago may not be known yet: asked again
// briefly.
func (r *Store) criImagePinned(ctx context.Context, name string) (bool, error) {
	cc, ok := r.conn.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		return false, errors.New("no gRPC connection to ask the CRI plugin on")
	}
	is := criapi.NewImageServiceClient(cc)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for {
		resp, err := is.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: name}})
		switch {
		case status.Code(err) == codes.Unimplemented:
			return false, errors.New("the CRI plugin does not serve (runtime.v1 ImageService)")
		case err != nil:
			return false, fmt.Errorf("ask the CRI plugin about %s: %w", name, err)
		case resp.GetImage() != nil:
			return resp.GetImage().GetPinned(), nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("the CRI plugin does not know %s", name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
