package pins

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd/conn"
)

// Pin labels: the contract other programs read (docs/architecture.md). A
// pin carries conn.LabelSource too, the reference asked for, which the
// leases of a pull's partial and prefetched content also carry.
const (
	LabelPin      = "io.gpupin.pin" // engine:version
	LabelVariant  = "io.gpupin.variant"
	LabelNode     = "io.gpupin.node" // node fingerprint
	LabelProbedAt = "io.gpupin.probed-at"
	// LabelProbe names the probe that proved the pin (torch, cuda, exec),
	// as the same key names it on an index entry.
	LabelProbe = "io.gpupin.probe"
	// LabelVerdict is the probe's verdict, compact JSON. Pins made before
	// it existed kept the verdict under LabelProbe; they still read.
	LabelVerdict  = "io.gpupin.verdict"
	LabelOverride = "io.gpupin.override"
	// LabelSimulated marks a pin whose probe ran on simulated node facts.
	LabelSimulated = "io.gpupin.simulated"
	// LabelPrevious marks the pin an engine had before its current one,
	// kept for rollback until gc.
	LabelPrevious = "io.gpupin.previous"
	// LabelCRIPinned keeps kubelet's image GC off the image.
	LabelCRIPinned = "io.cri-containerd.pinned"
	// LabelSigned* record the signature policy's answer before the pull
	// (Pin.Signed). A pin made before the policy existed, or under mode
	// off, has none of them and reads with Signed nil.
	LabelSignedMode   = "io.gpupin.signed.mode"
	LabelSignedBy     = "io.gpupin.signed.by"
	LabelSignedDigest = "io.gpupin.signed.digest"
	LabelSignedAt     = "io.gpupin.signed.at"
)

// Signature is what the trust policy verified before a pin's image was
// pulled: under which mode, whose key or identity signed, and which digest
// the signature covered (the manifest's, or the index it was chosen from).
type Signature struct {
	Mode   string    `json:"mode"`
	By     string    `json:"by"`
	Digest string    `json:"digest"`
	At     time.Time `json:"at"`
}

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
	Probe     string    `json:"probe"`   // the probe kind
	Verdict   string    `json:"verdict"` // compact
	Simulated bool      `json:"simulated,omitempty"`
	Previous  bool      `json:"previous,omitempty"`
	// Tampered is set when the record's target is not the digest its name
	// says: someone repointed it. Such a record is no pin, and never runs.
	Tampered  bool      `json:"tampered,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	// Local is the node-local name (gpupin.local/ENGINE:VERSION) that
	// points at this pin, for pods with imagePullPolicy: Never.
	Local string `json:"local,omitempty"`
	// Restored is when Recover last put the pin back after another
	// client of containerd removed or relabelled its record.
	Restored time.Time `json:"restored_at,omitzero"`
	// Signed is the signature verified before the pull; nil when no
	// policy asked for one.
	Signed *Signature `json:"signed,omitempty"`
}

func (p Pin) labels() map[string]string {
	verdict := p.Verdict
	if len(LabelVerdict)+len(verdict) > maxLabel {
		verdict = verdict[:maxLabel-len(LabelVerdict)-3] + "..."
	}
	l := map[string]string{
		conn.LabelManaged: "true",
		LabelPin:          p.Key,
		LabelVariant:      p.Variant,
		conn.LabelSource:  p.Source,
		LabelNode:         p.Node,
		// Nanoseconds: the newest probe of a key wins, also within a second.
		LabelProbedAt:  p.ProbedAt.UTC().Format(time.RFC3339Nano),
		LabelProbe:     p.Probe,
		LabelVerdict:   verdict,
		LabelOverride:  p.Override,
		LabelCRIPinned: "pinned",
		LabelSimulated: strconv.FormatBool(p.Simulated),
	}
	if s := p.Signed; s != nil {
		by := s.By
		if len(LabelSignedBy)+len(by) > maxLabel {
			by = by[:maxLabel-len(LabelSignedBy)-3] + "..."
		}
		l[LabelSignedMode], l[LabelSignedBy], l[LabelSignedDigest] = s.Mode, by, s.Digest
		l[LabelSignedAt] = s.At.UTC().Format(time.RFC3339Nano)
	}
	return l
}

// pinLabelKeys are every label a pin sets or clears, as update field paths.
var pinLabelKeys = []string{LabelPin, LabelVariant, conn.LabelSource, LabelNode, LabelProbedAt, LabelProbe, LabelVerdict,
	LabelOverride, LabelCRIPinned, LabelSimulated, LabelPrevious, conn.LabelRole, conn.LabelOwner, conn.LabelManaged, LabelRestored,
	LabelSignedMode, LabelSignedBy, LabelSignedDigest, LabelSignedAt}

func pinFromImage(img images.Image) Pin {
	l := img.Labels
	p := Pin{
		Key: l[LabelPin], Ref: img.Name, Digest: img.Target.Digest.String(),
		Variant: l[LabelVariant], Source: l[conn.LabelSource], Override: l[LabelOverride],
		Node: l[LabelNode], Probe: l[LabelProbe], Verdict: l[LabelVerdict], Simulated: l[LabelSimulated] == "true",
		UpdatedAt: img.UpdatedAt, Tampered: conn.Tampered(img),
	}
	if p.Verdict == "" && strings.HasPrefix(p.Probe, "{") {
		// Made before the verdict had a key of its own.
		p.Verdict, p.Probe = p.Probe, ""
	}
	if p.Key == "" && l[LabelPrevious] != "" {
		p.Key, p.Previous = l[LabelPrevious], true
	}
	p.ProbedAt, _ = time.Parse(time.RFC3339Nano, l[LabelProbedAt])
	p.Restored, _ = time.Parse(time.RFC3339, l[LabelRestored])
	if l[LabelSignedMode] != "" {
		p.Signed = &Signature{Mode: l[LabelSignedMode], By: l[LabelSignedBy], Digest: l[LabelSignedDigest]}
		p.Signed.At, _ = time.Parse(time.RFC3339Nano, l[LabelSignedAt])
	}
	return p
}

// newer orders two records of one key by when containerd wrote them (its
// own clock, so every process agrees), then by name: the last pin made is
// the pin.
func newer(a, b Pin) bool {
	if !a.UpdatedAt.Equal(b.UpdatedAt) {
		return a.UpdatedAt.After(b.UpdatedAt)
	}
	return a.Ref > b.Ref
}

// Pins lists the current pins, one per engine:version, and records that
// were pins but point elsewhere now (Tampered), so they can be shown and
// never run. When two records claim one key (a crash between making a new
// pin and demoting the old), the one written last wins; the next SetPin
// demotes the other.
//
// It runs Recover first: a pin another client of containerd relabelled or
// deleted is put back while its content remains, so whoever reads pins
// (the provisioner first of all) answers from it without the registry.
// A repair that fails (one key's lock wait cut short, its content gone)
// does not fail the reading: the pins are listed as containerd holds them,
// and the next Recover (the agent's pass, the next Pins) tries again.
func (r *Store) Pins(ctx context.Context) ([]Pin, error) {
	r.Recover(ctx)
	return r.ListPins(ctx)
}

// ListPins lists the pins as containerd holds them now, as Pins does but
// without recovering first: it only reads. A pin another client took
// shows as missing (or as that client left it) until the next Pins,
// provision or agent pass restores it. `gpupin plan`, `gpupin pins` and the agent's
// GET /v1/pins read pins so.
func (r *Store) ListPins(ctx context.Context) ([]Pin, error) {
	ctx = r.conn.Ctx(ctx)
	imgs, err := r.conn.Client.ImageService().List(ctx, fmt.Sprintf(`labels.%q`, LabelPin))
	if err != nil {
		return nil, fmt.Errorf("list pins: %w", err)
	}
	locals, err := r.localNames(ctx)
	if err != nil {
		return nil, err
	}
	best := map[string]Pin{}
	var bad []Pin
	for _, img := range imgs {
		p := pinFromImage(img)
		if p.Tampered {
			bad = append(bad, p)
			continue
		}
		if cur, ok := best[p.Key]; !ok || newer(p, cur) {
			best[p.Key] = p
		}
	}
	out := make([]Pin, 0, len(best)+len(bad))
	for _, p := range best {
		for _, l := range locals[p.Key] {
			// Only the name gpupin wrote for this pin counts (foreignLocal).
			if l.Target.Digest.String() == p.Digest && l.Labels[LabelLocalPin] == p.Ref {
				p.Local = l.Name
				break
			}
		}
		out = append(out, p)
	}
	out = append(out, bad...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return !out[i].Tampered && out[j].Tampered
	})
	return out, nil
}

// PreviousPins lists the records kept for rollback.
func (r *Store) PreviousPins(ctx context.Context) ([]Pin, error) {
	imgs, err := r.conn.Client.ImageService().List(r.conn.Ctx(ctx), fmt.Sprintf(`labels.%q`, LabelPrevious))
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

// GetPin returns the pin of engine:version, or nil. A tampered record of
// the key is an error, never a pin to run.
func (r *Store) GetPin(ctx context.Context, key string) (*Pin, error) {
	pins, err := r.Pins(ctx)
	if err != nil {
		return nil, err
	}
	var bad *Pin
	for _, p := range pins {
		if p.Key != key {
			continue
		}
		if !p.Tampered {
			return &p, nil
		}
		bad = &p
	}
	if bad != nil {
		return nil, fmt.Errorf("pin of %s: %w", key, conn.TamperedError(bad.Ref, digest.Digest(bad.Digest)))
	}
	return nil, nil
}

// ErrNoPin marks a target that no pin answers to.
var ErrNoPin = errors.New("no pin")

// PinToRun is the pin a replica of target starts from (what `gpupin run`
// uses): target is a key (engine:version), a pinned reference
// (repo@sha256:…) or the source a pin was made from. A tampered record is
// never the answer: when only such a record answers, the error wraps
// conn.ErrTampered; when none does, ErrNoPin.
func (r *Store) PinToRun(ctx context.Context, target string) (*Pin, error) {
	pins, err := r.Pins(ctx)
	if err != nil {
		return nil, err
	}
	return FindPin(pins, target)
}

// FindPin picks target's pin from pins (as Pins lists them), as PinToRun
// does. The most specific match decides: a reference, then a key, then a
// source; within one, an untampered record wins, and a tampered one alone
// is refused rather than passed over, so a name never falls through to
// another image.
func FindPin(pins []Pin, target string) (*Pin, error) {
	matchers := []func(Pin) bool{
		func(p Pin) bool { return p.Ref == target },
		func(p Pin) bool { return p.Key == target },
		func(p Pin) bool { return p.Source == target },
	}
	for _, match := range matchers {
		var bad *Pin
		for i := range pins {
			if !match(pins[i]) {
				continue
			}
			if !pins[i].Tampered {
				p := pins[i]
				return &p, nil
			}
			if bad == nil {
				bad = &pins[i]
			}
		}
		if bad != nil {
			return nil, fmt.Errorf("pin of %s: %w", bad.Key, conn.TamperedError(bad.Ref, digest.Digest(bad.Digest)))
		}
	}
	var keys []string
	for _, p := range pins {
		if !p.Tampered {
			keys = append(keys, p.Key)
		}
	}
	if len(keys) == 0 {
		keys = []string{"none"}
	}
	return nil, fmt.Errorf("%s has no pin (%w; pinned: %s); run gpupin provision first", target, ErrNoPin, strings.Join(keys, ", "))
}

// SetPinOptions tune SetPin.
type SetPinOptions struct {
	// Takeover lets the pin replace a pin of the key made from another
	// source: the want named the key itself. Without it such a pin stays,
	// and SetPin fails with ErrHeld.
	Takeover bool
}

// ErrHeld marks a key pinned from another source.
var ErrHeld = errors.New("pin key held from another source")

// ErrSuperseded marks a pin another provision of the key replaced at once.
var ErrSuperseded = errors.New("superseded by a newer pin of the key")

// HeldError is a SetPin that did not make its pin because another record
// of the key stands: one from another source (ErrHeld), or a newer pin
// that landed at once (ErrSuperseded). It names that record, so a caller
// can say whose the key is.
type HeldError struct {
	Key        string
	Ref        string // the record that holds the key
	Source     string // the source it was pinned from
	Claimed    string // the source of the pin refused
	Tampered   bool   // the holder was repointed outside gpupin
	Superseded bool
}

func (e *HeldError) Error() string {
	if e.Superseded {
		return fmt.Sprintf("pin %s: %v (%s, from %s)", e.Key, ErrSuperseded, e.Ref, e.Source)
	}
	what := ""
	if e.Tampered {
		what = ", a record changed outside gpupin that holds the key until it is unpinned"
	}
	return fmt.Sprintf("pin %s: %v: it is pinned from %s (%s%s), not %s", e.Key, ErrHeld, e.Source, e.Ref, what, e.Claimed)
}

func (e *HeldError) Is(target error) bool {
	return (target == ErrHeld && !e.Superseded) || (target == ErrSuperseded && e.Superseded)
}

// SetPin makes p.Ref the pin of p.Key: one update sets every label on the
// record (containerd applies it atomically), then other records of the
// key are demoted to previous. Only a probe that passed may call this.
//
// Two SetPins of one key never interleave: the step holds the key in the
// daemon (lockPinKey), whatever lock directory each process uses. Should a
// record still be written after this one (by a tool that takes no lock),
// this pin steps back for it rather than demote it.
func (r *Store) SetPin(ctx context.Context, p Pin, opts SetPinOptions) error {
	ctx = r.conn.Ctx(ctx)
	// A pin says the image was proved: its files are on disk before it
	// is written, or a power cut could leave it naming a snapshot whose
	// files never were (durable.go). Before the key's lock: a slow disk
	// must not hold the key.
	if err := r.synced(ctx); err != nil {
		return fmt.Errorf("pin %s: %w", p.Key, err)
	}
	unlock, err := r.lockPinKey(ctx, p.Key)
	if err != nil {
		return err
	}
	defer unlock()
	is := r.conn.Client.ImageService()
	img, err := is.Get(ctx, p.Ref)
	if err != nil {
		return fmt.Errorf("pin %s: image record %s: %w", p.Key, p.Ref, err)
	}
	if conn.Tampered(img) {
		return fmt.Errorf("pin %s: %w", p.Key, conn.TamperedError(p.Ref, img.Target.Digest))
	}
	if p.Digest != "" && img.Target.Digest.String() != p.Digest {
		return fmt.Errorf("pin %s: %s points at %s, but %s was probed", p.Key, p.Ref, img.Target.Digest, p.Digest)
	}
	if other := img.Labels[LabelPin]; other != "" && other != p.Key {
		return fmt.Errorf("pin %s: %s is already the pin of %s; one image record holds one pin", p.Key, p.Ref, other)
	}
	others, err := is.List(ctx, fmt.Sprintf(`labels.%q==%q`, LabelPin, p.Key))
	if err != nil {
		return fmt.Errorf("pin %s: list its records: %w", p.Key, err)
	}
	if !opts.Takeover {
		for _, o := range others {
			// A tampered record holds its key too, until an operator
			// unpins it: it is nobody's to take by metadata.
			if op := pinFromImage(o); o.Name != p.Ref && op.Source != p.Source {
				return &HeldError{Key: p.Key, Ref: o.Name, Source: op.Source, Claimed: p.Source, Tampered: op.Tampered}
			}
		}
	}
	img.Labels = p.labels()
	updated, err := is.Update(ctx, img, labelPaths(pinLabelKeys)...)
	if err != nil {
		return fmt.Errorf("pin %s: update %s: %w", p.Key, p.Ref, err)
	}
	// The pin is in effect from here on. A demotion that fails now is
	// finished by the next SetPin of the key, so it is not reported as a
	// failed pin.
	//
	// Before the lock goes, the key's proof, its lease and its local name
	// follow whichever record stands as the pin: one step, so the local
	// name never points at an image another process just replaced. Should
	// that fail, the pin still stands, and the next Pins (Recover) finishes it.
	// Once now, before anything is demoted (so the old proof is gone before
	// its record steps back: nothing can restore it), and once at the end.
	r.fixKey(ctx, p.Key)
	defer r.fixKey(ctx, p.Key)
	if others, err = is.List(ctx, fmt.Sprintf(`labels.%q==%q`, LabelPin, p.Key)); err != nil {
		return nil
	}
	mine := pinFromImage(updated)
	for _, o := range others {
		if o.Name == p.Ref {
			continue
		}
		if op := pinFromImage(o); op.Tampered || newer(mine, op) {
			r.demote(ctx, o, p.Key)
		} else {
			// A newer pin of the key landed meanwhile: it stands, this
			// one steps back.
			r.demote(ctx, updated, p.Key)
			return &HeldError{Key: p.Key, Ref: o.Name, Source: op.Source, Claimed: p.Source, Superseded: true}
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
				o.Labels = map[string]string{conn.LabelManaged: "true"}
				is.Update(ctx, o, labelPaths([]string{LabelPrevious})...)
			}
		}
	}
	return nil
}

// demote makes a pin a previous pin: it keeps every label that says how
// it was proved, so a rollback knows what it returns to, and loses the
// ones that make it a pin (the key, kubelet's pinned mark).
func (r *Store) demote(ctx context.Context, img images.Image, key string) error {
	keep := map[string]string{conn.LabelManaged: "true", LabelPrevious: key}
	for _, k := range []string{LabelVariant, conn.LabelSource, LabelNode, LabelProbedAt, LabelProbe, LabelVerdict, LabelOverride, LabelSimulated} {
		if v, ok := img.Labels[k]; ok {
			keep[k] = v
		}
	}
	img.Labels = keep
	_, err := r.conn.Client.ImageService().Update(ctx, img, labelPaths(pinLabelKeys)...)
	return err
}

// Unpin removes the pin of key and its local names; the image stays, as
// a previous pin, until gc. A pin that another client took (and Recover
// would put back) is unpinned too: its proof goes.
func (r *Store) Unpin(ctx context.Context, key string) (*Pin, error) {
	ctx = r.conn.Ctx(ctx)
	unlock, err := r.lockPinKey(ctx, key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	states, err := r.keyStates(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("unpin %s: %w", key, err)
	}
	s := states[key]
	if s == nil || (len(s.pins) == 0 && s.newest() == nil) {
		return nil, fmt.Errorf("unpin %s: %w", key, errdefs.ErrNotFound)
	}
	var p Pin
	if best := s.best(); best != nil {
		p = pinFromImage(*best)
	} else if len(s.pins) > 0 {
		p = pinFromImage(s.pins[0])
	} else {
		np := s.newest()
		p = pinFromImage(images.Image{Name: np.Ref, Target: np.target(), Labels: np.Labels})
	}
	// The proof goes first: a record demoted while its proof stood could
	// be put back by a Recover that saw it deleted in between.
	if err := r.clearProofs(ctx, key, s); err != nil {
		return nil, fmt.Errorf("unpin %s: %w", key, err)
	}
	for _, img := range s.pins {
		if err := r.demote(ctx, img, key); err != nil {
			return nil, fmt.Errorf("unpin %s: %w", key, err)
		}
	}
	for _, l := range s.locals {
		if err := r.conn.Client.ImageService().Delete(ctx, l.Name); err != nil && !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("unpin %s: remove the local name %s: %w", key, l.Name, err)
		}
	}
	return &p, nil
}

// DiscardCandidate removes a record this process pulled for a candidate
// that did not pass; never a pin, never a record it did not make.
func (r *Store) DiscardCandidate(ctx context.Context, name string) error {
	ctx = r.conn.Ctx(ctx)
	is := r.conn.Client.ImageService()
	return conn.Cleanup(ctx, func(ctx context.Context) error {
		img, err := is.Get(ctx, name)
		if err != nil {
			return err
		}
		if img.Labels[LabelPin] != "" || img.Labels[LabelPrevious] != "" || img.Labels[conn.LabelRole] != "candidate" {
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
