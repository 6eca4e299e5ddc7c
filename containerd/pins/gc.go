package pins

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/containerd/conn"
)

// Collected is what gc swept, and the image records it removed, let go
// of, and kept.
type Collected struct {
	Swept   Swept    `json:"swept"`
	Removed []string `json:"removed"`
	// Released are records gpupin adopted but did not create: its labels
	// are taken off and the record stays for whoever made it.
	Released []string `json:"released,omitempty"`
	Kept     []string `json:"kept"`
}

// GC is `gpupin gc`: it sweeps what interrupted runs left (Sweep), then
// removes gpupin's image records that no pin and no container uses.
// The previous pin of each engine stays for rollback unless all is set;
// all also takes candidates that a process of another pid namespace left
// more than a lease's life ago.
// containerd's own garbage collector then frees the content.
//
// It recovers first (Pins runs Recover): a pin that another client removed or
// relabelled is put back rather than collected, and a key without a pin
// loses its local names and the lease on its content. A local name stays
// while it points at its key's pin.
func (r *Store) GC(ctx context.Context, all bool) (Collected, error) {
	var out Collected
	ctx = r.conn.Ctx(ctx)
	var err error
	if out.Swept, err = r.Sweep(ctx); err != nil {
		return out, fmt.Errorf("gc: %w", err)
	}
	pins, err := r.Pins(ctx) // recovers first
	if err != nil {
		return out, fmt.Errorf("gc: %w", err)
	}
	pinned := map[string]string{} // key -> digest of its pin
	for _, p := range pins {
		if !p.Tampered {
			pinned[p.Key] = p.Digest
		}
	}
	used := map[string]bool{}
	conts, err := r.conn.Client.Containers(ctx)
	if err != nil {
		return out, fmt.Errorf("gc: list containers: %w", err)
	}
	for _, c := range conts {
		info, err := c.Info(ctx)
		if err == nil {
			used[info.Image] = true
		}
	}
	is := r.conn.Client.ImageService()
	imgs, err := is.List(ctx, fmt.Sprintf(`labels.%q`, conn.LabelManaged))
	if err != nil {
		return out, fmt.Errorf("gc: list images: %w", err)
	}
	for _, img := range imgs {
		l := img.Labels
		// A record repointed outside gpupin is no pin, whatever it is labelled.
		keep := (l[LabelPin] != "" && !conn.Tampered(img)) || used[img.Name] ||
			(l[LabelLocal] != "" && pinned[l[LabelLocal]] == img.Target.Digest.String()) ||
			(l[LabelPrevious] != "" && !all && !conn.Tampered(img)) ||
			(l[conn.LabelRole] == "candidate" && conn.OwnerAlive(l[conn.LabelOwner]) && !(all && conn.StaleForeign(l[conn.LabelOwner], img.CreatedAt)))
		if keep {
			out.Kept = append(out.Kept, img.Name)
			continue
		}
		if l[conn.LabelCreated] != "true" {
			img.Labels = nil
			if _, err := is.Update(ctx, img, labelPaths(append(pinLabelKeys, conn.LabelCreated))...); err != nil && !errdefs.IsNotFound(err) {
				return out, fmt.Errorf("gc: let go of %s: %w", img.Name, err)
			}
			out.Released = append(out.Released, img.Name)
			continue
		}
		if err := is.Delete(ctx, img.Name); err != nil && !errdefs.IsNotFound(err) {
			return out, fmt.Errorf("gc: remove %s: %w", img.Name, err)
		}
		out.Removed = append(out.Removed, img.Name)
	}
	return out, nil
}
