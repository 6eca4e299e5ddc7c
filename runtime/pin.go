package runtime

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
)

// Pin labels, as DESIGN fixes them: other programs read these.
const (
	LabelPin      = "io.gpupin.pin" // engine:version
	LabelVariant  = "io.gpupin.variant"
	LabelSource   = "io.gpupin.source" // the reference asked for
	LabelNode     = "io.gpupin.node"   // node fingerprint
	LabelProbedAt = "io.gpupin.probed-at"
	LabelProbe    = "io.gpupin.probe" // the verdict, compact
	LabelOverride = "io.gpupin.override"
	// LabelSimulated marks a pin whose probe ran on simulated node facts.
	LabelSimulated = "io.gpupin.simulated"
	// LabelPrevious marks the pin an engine had before its current one,
	// kept for rollback until gc.
	LabelPrevious = "io.gpupin.previous"
	// LabelCRIPinned keeps kubelet's image GC off the image.
	LabelCRIPinned = "io.cri-containerd.pinned"
)

// maxLabel is containerd's limit on a label (key and value together).
const maxLabel = 4096

// Pin is an image record that was seen to compute on this node.
type Pin struct {
	Key       string    `json:"key"` // engine:version
	Ref       string    `json:"ref"` // repo@sha256:…
	Digest    string    `json:"digest"`
	Variant   string    `json:"variant"`
	Source    string    `json:"source"`
	Override  string    `json:"override"`
	Node      string    `json:"node"`
	ProbedAt  time.Time `json:"probed_at"`
	Probe     string    `json:"probe"`
	Simulated bool      `json:"simulated,omitempty"`
	Previous  bool      `json:"previous,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (p Pin) labels() map[string]string {
	probe := p.Probe
	if len(LabelProbe)+len(probe) > maxLabel {
		probe = probe[:maxLabel-len(LabelProbe)-3] + "..."
	}
	l := map[string]string{
		LabelManaged:   "true",
		LabelPin:       p.Key,
		LabelVariant:   p.Variant,
		LabelSource:    p.Source,
		LabelNode:      p.Node,
		LabelProbedAt:  p.ProbedAt.UTC().Format(time.RFC3339),
		LabelProbe:     probe,
		LabelOverride:  p.Override,
		LabelCRIPinned: "pinned",
		LabelSimulated: strconv.FormatBool(p.Simulated),
	}
	return l
}

// pinFields are every label a pin sets or clears, as update field paths.
var pinLabelKeys = []string{LabelPin, LabelVariant, LabelSource, LabelNode, LabelProbedAt, LabelProbe,
	LabelOverride, LabelCRIPinned, LabelSimulated, LabelPrevious, LabelRole, LabelOwner, LabelManaged}

func pinFromImage(img images.Image) Pin {
	l := img.Labels
	p := Pin{
		Key: l[LabelPin], Ref: img.Name, Digest: img.Target.Digest.String(),
		Variant: l[LabelVariant], Source: l[LabelSource], Override: l[LabelOverride],
		Node: l[LabelNode], Probe: l[LabelProbe], Simulated: l[LabelSimulated] == "true",
		UpdatedAt: img.UpdatedAt,
	}
	if p.Key == "" && l[LabelPrevious] != "" {
		p.Key, p.Previous = l[LabelPrevious], true
	}
	p.ProbedAt, _ = time.Parse(time.RFC3339, l[LabelProbedAt])
	return p
}

// Pins lists the current pins, one per engine:version. When two records
// claim the same key (a crash between making a new pin and demoting the
// old), the newest probe wins; the next SetPin demotes the other.
func (r *Runtime) Pins(ctx context.Context) ([]Pin, error) {
	imgs, err := r.client.ImageService().List(r.ctx(ctx), fmt.Sprintf(`labels.%q`, LabelPin))
	if err != nil {
		return nil, fmt.Errorf("list pins: %w", err)
	}
	best := map[string]Pin{}
	for _, img := range imgs {
		p := pinFromImage(img)
		if cur, ok := best[p.Key]; !ok || p.ProbedAt.After(cur.ProbedAt) {
			best[p.Key] = p
		}
	}
	out := make([]Pin, 0, len(best))
	for _, p := range best {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// PreviousPins lists the records kept for rollback.
func (r *Runtime) PreviousPins(ctx context.Context) ([]Pin, error) {
	imgs, err := r.client.ImageService().List(r.ctx(ctx), fmt.Sprintf(`labels.%q`, LabelPrevious))
	if err != nil {
		return nil, fmt.Errorf("list previous pins: %w", err)
	}
	var out []Pin
	for _, img := range imgs {
		if _, pinned := img.Labels[LabelPin]; pinned {
			continue
		}
		out = append(out, pinFromImage(img))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// GetPin returns the pin of engine:version, or nil.
func (r *Runtime) GetPin(ctx context.Context, key string) (*Pin, error) {
	pins, err := r.Pins(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range pins {
		if p.Key == key {
			return &p, nil
		}
	}
	return nil, nil
}

// SetPin makes p.Ref the pin of p.Key: one update sets every label on the
// record (containerd applies it atomically), then other records of the
// key are demoted to previous. Only a probe that passed may call this.
func (r *Runtime) SetPin(ctx context.Context, p Pin) error {
	ctx = r.ctx(ctx)
	is := r.client.ImageService()
	img, err := is.Get(ctx, p.Ref)
	if err != nil {
		return fmt.Errorf("pin %s: image record %s: %w", p.Key, p.Ref, err)
	}
	if other := img.Labels[LabelPin]; other != "" && other != p.Key {
		return fmt.Errorf("pin %s: %s is already the pin of %s; one image record holds one pin", p.Key, p.Ref, other)
	}
	img.Labels = p.labels()
	if _, err := is.Update(ctx, img, labelPaths(pinLabelKeys)...); err != nil {
		return fmt.Errorf("pin %s: update %s: %w", p.Key, p.Ref, err)
	}
	// The pin is in effect from here on: Pins takes the newest probe of a
	// key. A demotion that fails now is finished by the next SetPin of the
	// key, so it is not reported as a failed pin.
	others, err := is.List(ctx, fmt.Sprintf(`labels.%q==%q`, LabelPin, p.Key))
	if err != nil {
		return nil
	}
	for _, o := range others {
		if o.Name != p.Ref {
			r.demote(ctx, o, p.Key)
		}
	}
	// An older previous of this key is superseded: gc keeps one for rollback.
	prev, err := is.List(ctx, fmt.Sprintf(`labels.%q==%q`, LabelPrevious, p.Key))
	if err == nil {
		sort.Slice(prev, func(i, j int) bool { return prev[i].UpdatedAt.After(prev[j].UpdatedAt) })
		for i, o := range prev {
			if o.Name == p.Ref {
				continue
			}
			if i > 0 && o.Labels[LabelPin] == "" {
				o.Labels = map[string]string{LabelManaged: "true"}
				is.Update(ctx, o, labelPaths([]string{LabelPrevious})...)
			}
		}
	}
	return nil
}

func (r *Runtime) demote(ctx context.Context, img images.Image, key string) error {
	img.Labels = map[string]string{
		LabelManaged:  "true",
		LabelPrevious: key,
		LabelVariant:  img.Labels[LabelVariant],
		LabelSource:   img.Labels[LabelSource],
		LabelNode:     img.Labels[LabelNode],
		LabelProbedAt: img.Labels[LabelProbedAt],
		LabelProbe:    img.Labels[LabelProbe],
	}
	_, err := r.client.ImageService().Update(ctx, img, labelPaths(pinLabelKeys)...)
	return err
}

// Unpin removes the pin of key; the image stays, as a previous pin, until gc.
func (r *Runtime) Unpin(ctx context.Context, key string) (*Pin, error) {
	ctx = r.ctx(ctx)
	imgs, err := r.client.ImageService().List(ctx, fmt.Sprintf(`labels.%q==%q`, LabelPin, key))
	if err != nil {
		return nil, fmt.Errorf("unpin %s: %w", key, err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("unpin %s: %w", key, errdefs.ErrNotFound)
	}
	p := pinFromImage(imgs[0])
	for _, img := range imgs {
		if err := r.demote(ctx, img, key); err != nil {
			return nil, fmt.Errorf("unpin %s: %w", key, err)
		}
	}
	return &p, nil
}

// DiscardCandidate removes a record this process pulled for a candidate
// that did not pass; never a pin, never a record it did not make.
func (r *Runtime) DiscardCandidate(ctx context.Context, name string) error {
	ctx = r.ctx(ctx)
	is := r.client.ImageService()
	return cleanup(ctx, func(ctx context.Context) error {
		img, err := is.Get(ctx, name)
		if err != nil {
			return err
		}
		if img.Labels[LabelPin] != "" || img.Labels[LabelPrevious] != "" || img.Labels[LabelRole] != "candidate" {
			return nil
		}
		return is.Delete(ctx, name)
	})
}

func labelPaths(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = "labels." + k
	}
	return out
}
