package pins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd/conn"
)

// A pin must survive other clients of containerd. A pull of the pinned
// reference by ctr, crictl or kubelet writes the image record anew and
// loses its labels (containerd's Pull updates an existing record whole);
// kubelet's image GC and `crictl rmi --prune` delete the record where the
// CRI plugin has no notion of pinned images (containerd 1.6). So the
// proof is kept twice:
//
//   - on the record, as the labels other programs read (pin.go);
//   - as a label of the manifest's own entry in the content store,
//     io.gpupin.proof/ENGINE:VERSION, holding the record's name, target
//     and labels. A pull only adds its garbage-collection and
//     distribution-source labels to content that is there already, each
//     by its own field path, so this one stays.
//
// One lease per key (gpupin-pin-…, no expiry) holds that manifest, and
// through its references the config, the layers and the unpacked
// snapshots, so a record deleted by another client leaves its content
// behind. Recover (which Pins runs first) compares the two and puts back
// what another client took: the labels on a relabelled record, the record
// itself while its content remains. A proof that can no longer be
// restored is dropped, and the engine is proved again.
//
// What was taken back by gpupin is never restored: unpin and a new pin
// clear the old proof before they demote its record; a proof whose record
// is demoted (io.gpupin.previous) or tampered (its target is not the
// digest in its name) is dropped; only the newest proof of a key counts,
// and only when no pin of the key was written after it.

// proofLabelPrefix names the content label that keeps a key's proof.
const proofLabelPrefix = "io.gpupin.proof/"

func proofLabel(key string) string { return proofLabelPrefix + key }

// PinLeaseRole is the io.gpupin.role of the lease that holds a pin's
// content (gpupin-pin-…, labelled io.gpupin.pin with its key). The lease
// carries no io.gpupin.managed label, so no sweep of leftovers lists it;
// it goes with its pin (unpin, or a Recover that finds no pin).
const PinLeaseRole = "pin"

func pinLeaseID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "gpupin-pin-" + hex.EncodeToString(sum[:8])
}

// proof is what a content label keeps of a pin record.
type proof struct {
	Ref       string `json:"ref"`
	MediaType string `json:"media_type"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	// PinnedAt is the record's UpdatedAt when it became (or was last
	// confirmed as) the pin: containerd's clock, which every process
	// shares, so it orders a proof against the key's other records.
	PinnedAt time.Time         `json:"pinned_at"`
	Labels   map[string]string `json:"labels"`
}

// proofLabelKeys are the record labels a proof keeps: how it was proved,
// not who was working on it (owner, role) nor its history.
var proofLabelKeys = []string{conn.LabelManaged, LabelPin, LabelVariant, conn.LabelSource, LabelNode, LabelProbedAt,
	LabelProbe, LabelVerdict, LabelOverride, LabelCRIPinned, LabelSimulated, conn.LabelCreated}

func proofOf(img images.Image) proof {
	p := proof{Ref: img.Name, MediaType: img.Target.MediaType, Digest: img.Target.Digest.String(),
		Size: img.Target.Size, PinnedAt: img.UpdatedAt.UTC(), Labels: map[string]string{}}
	for _, k := range proofLabelKeys {
		if v, ok := img.Labels[k]; ok {
			p.Labels[k] = v
		}
	}
	return p
}

// encode renders the proof as a label value that fits containerd's limit
// with its key; the verdict, kept in full on the record, is what is
// shortened when it must be.
func (p proof) encode(key string) (string, error) {
	room := maxLabel - len(proofLabel(key))
	for range 4 {
		b, err := json.Marshal(p)
		if err != nil {
			return "", fmt.Errorf("encode the proof of %s: %w", key, err)
		}
		over := len(b) - room
		if over <= 0 {
			return string(b), nil
		}
		v := p.Labels[LabelVerdict]
		if len(v) <= over+3+16 {
			return "", fmt.Errorf("the proof of %s does not fit a label (%d bytes over)", key, over)
		}
		// JSON escaping may make the cut count for more: try again.
		p.Labels = cloneLabels(p.Labels)
		p.Labels[LabelVerdict] = v[:len(v)-over-3-16] + "..."
	}
	return "", fmt.Errorf("the proof of %s does not fit a label", key)
}

func cloneLabels(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (p proof) target() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: p.MediaType, Digest: digest.Digest(p.Digest), Size: p.Size}
}

// matches reports whether the proof is the one img, as the pin, would write.
func (p proof) matches(img images.Image) bool {
	q := proofOf(img)
	if p.Ref != q.Ref || p.Digest != q.Digest || p.MediaType != q.MediaType || p.Size != q.Size || !p.PinnedAt.Equal(q.PinnedAt) {
		return false
	}
	for k, v := range q.Labels {
		if k != LabelVerdict && p.Labels[k] != v {
			return false
		}
	}
	return true
}

// storedProof is a proof and the content it is a label of.
type storedProof struct {
	proof
	on    digest.Digest
	valid bool // false: the label is missing or does not parse
}

// Recovered is one repair Recover made.
type Recovered struct {
	Key string `json:"key"`
	Ref string `json:"ref,omitempty"`
	// Action is what was done:
	//   relabelled: the pin's labels are back on a record another client
	//               pulled over;
	//   recreated:  the pin's record is back, from content that remained
	//               after another client deleted it;
	//   dropped:    a proof that cannot be restored is gone (Detail says
	//               why); without a pin the engine is proved again;
	//   proof:      a pin without a proof (made before proofs were kept,
	//               or a step cut short) got one;
	//   local:      the key's local name was made or moved to its pin;
	//   cleared:    a key without a pin lost its local names and lease;
	//   foreign:    a record of a local name that gpupin did not write on
	//               this node (a pull, from a peer through a mirror, or
	//               one made by hand) was replaced by the node's own, or
	//               removed where the node has no pin of the key (Detail
	//               says which, and what it pointed at).
	Action string `json:"action"`
	Detail string `json:"detail,omitempty"`
}

// keyState is what containerd holds for one key.
type keyState struct {
	pins []images.Image // records labelled io.gpupin.pin=key
	// locals are the records labelled io.gpupin.local=key, and a record
	// of the key's local name under this store's prefix that is not
	// (foreign: a pull of the name, ctr tag).
	locals []images.Image
	lease  bool
	proofs []storedProof
}

func (s *keyState) best() *images.Image {
	var best *images.Image
	for i := range s.pins {
		if conn.Tampered(s.pins[i]) {
			continue
		}
		if best == nil || newerRecord(s.pins[i], *best) {
			best = &s.pins[i]
		}
	}
	return best
}

// newest is the proof written last, the only one that may be restored;
// the others are stale. When the lease holds content whose proof cannot
// be read (its content was deleted, its label taken off), that one may
// have been the newest: none is trusted, and the engine is proved again.
func (s *keyState) newest() *storedProof {
	var n *storedProof
	for i := range s.proofs {
		p := &s.proofs[i]
		if !p.valid {
			return nil
		}
		if n == nil || p.PinnedAt.After(n.PinnedAt) {
			n = p
		}
	}
	return n
}

// newerRecord is newer for image records: containerd's clock, then name.
func newerRecord(a, b images.Image) bool {
	if !a.UpdatedAt.Equal(b.UpdatedAt) {
		return a.UpdatedAt.After(b.UpdatedAt)
	}
	return a.Name > b.Name
}

// settled reports whether the key needs nothing: its pin has exactly its
// own proof, and its local names point at it; or it has no pin and
// nothing else either.
func (r *Store) settled(key string, s *keyState) bool {
	best := r.current(s)
	if best == nil {
		return len(s.locals) == 0 && !s.lease && len(s.proofs) == 0
	}
	if !s.lease || len(s.proofs) != 1 || !s.proofs[0].valid || s.proofs[0].on != best.Target.Digest || !s.proofs[0].matches(*best) {
		return false
	}
	own := r.LocalName(key)
	found := own == ""
	for _, l := range s.locals {
		if l.Target.Digest != best.Target.Digest || l.Target.MediaType != best.Target.MediaType ||
			l.Labels[LabelLocal] != key || l.Labels[LabelLocalPin] != best.Name {
			return false
		}
		found = found || l.Name == own
	}
	return found
}

// toRestore is the proof to restore, if any: the newest, when it was
// written after every record that still carries the key (its own record
// lost its labels or went).
func (s *keyState) toRestore() *storedProof {
	best := s.best()
	if p := s.newest(); p != nil && (best == nil || (p.Ref != best.Name && best.UpdatedAt.Before(p.PinnedAt))) {
		return p
	}
	return nil
}

// current is the pin record that stands as the key's pin, when no proof
// is to be restored: the newest untampered record labelled with the key.
func (r *Store) current(s *keyState) *images.Image {
	if s.toRestore() != nil {
		return nil // the record the proof names must be looked at
	}
	return s.best()
}

// Recover puts back pins that other clients of containerd took, as far as
// their content remains, and keeps each pin's proof, lease and local name
// in step with it (see the top of this file). Pins runs it first, so every
// reader of pins (the provisioner, `gpupin pins`, `gpupin run`) sees them
// restored; the agent runs it on its sweep timer, so a pin that kubelet's
// image GC removed is back within that period. When nothing needs doing it
// is three listings and a look at each key's proof.
func (r *Store) Recover(ctx context.Context) ([]Recovered, error) {
	ctx = r.conn.Ctx(ctx)
	states, err := r.keyStates(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("recover pins: %w", err)
	}
	keys := make([]string, 0, len(states))
	for k := range states {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []Recovered
	var errs []error
	for _, key := range keys {
		if key == strayKey {
			done, err := r.removeStrays(ctx, states[key].locals)
			out = append(out, done...)
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if r.settled(key, states[key]) {
			continue
		}
		// A key whose pin step takes long (a restore unpacking) is left for
		// the next pass rather than holding up every reader of pins.
		lctx, cancel := context.WithTimeout(ctx, recoverLockWait)
		unlock, err := r.lockPinKey(lctx, key)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done, err := r.fixKey(ctx, key)
		unlock()
		out = append(out, done...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("recover pins: %w", err)
	}
	return out, nil
}

// recoverLockWait bounds how long Recover waits for one key's pin lock.
var recoverLockWait = 10 * time.Second

// keyStates reads what containerd holds for every key, or for one.
func (r *Store) keyStates(ctx context.Context, only string) (map[string]*keyState, error) {
	is := r.conn.Client.ImageService()
	filter := func(label string) string {
		if only != "" {
			return fmt.Sprintf(`labels.%q==%q`, label, only)
		}
		return fmt.Sprintf(`labels.%q`, label)
	}
	states := map[string]*keyState{}
	state := func(key string) *keyState {
		s := states[key]
		if s == nil {
			s = &keyState{}
			states[key] = s
		}
		return s
	}
	pins, err := is.List(ctx, filter(LabelPin))
	if err != nil {
		return nil, fmt.Errorf("list pins: %w", err)
	}
	for _, img := range pins {
		s := state(img.Labels[LabelPin])
		s.pins = append(s.pins, img)
	}
	locals, err := is.List(ctx, filter(LabelLocal))
	if err != nil {
		return nil, fmt.Errorf("list local names: %w", err)
	}
	for _, img := range locals {
		s := state(img.Labels[LabelLocal])
		s.locals = append(s.locals, img)
	}
	// A record under the prefix that carries no io.gpupin.local label is
	// nobody's local name, yet pods that name it run it: a pull of the
	// name (through a peer-to-peer mirror that serves another node's
	// record), ctr tag. It joins the key whose name it has, or the strays.
	var named []images.Image
	if only != "" {
		img, err := is.Get(ctx, r.LocalName(only))
		if err != nil && !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("get the local name of %s: %w", only, err)
		}
		if err == nil {
			named = append(named, img)
		}
	} else {
		named, err = is.List(ctx, fmt.Sprintf("name~=%q", "^"+regexp.QuoteMeta(r.localPrefix+"/")))
		if err != nil {
			return nil, fmt.Errorf("list records under %s/: %w", r.localPrefix, err)
		}
	}
	for _, img := range named {
		l := img.Labels
		if l[LabelLocal] != "" {
			continue // listed above
		}
		key := only
		if key == "" {
			key = r.localNameKey(img.Name, states)
		}
		if key == strayKey && (l[LabelPin] != "" || l[LabelPrevious] != "" || l[conn.LabelRole] != "") {
			// gpupin's record of another kind (a pin of an image named
			// under the prefix), never a local name: not a stray.
			continue
		}
		s := state(key)
		s.locals = append(s.locals, img)
	}
	ls := r.conn.Client.LeasesService()
	lf := fmt.Sprintf(`labels.%q==%q`, conn.LabelRole, PinLeaseRole)
	if only != "" {
		lf = fmt.Sprintf("id==%q", pinLeaseID(only))
	}
	held, err := ls.List(ctx, lf)
	if err != nil {
		return nil, fmt.Errorf("list pin leases: %w", err)
	}
	cs := r.conn.Client.ContentStore()
	for _, l := range held {
		key := l.Labels[LabelPin]
		if key == "" || l.ID != pinLeaseID(key) {
			continue // not one of ours, whatever its labels say
		}
		s := state(key)
		s.lease = true
		res, err := ls.ListResources(ctx, l)
		if err != nil {
			return nil, fmt.Errorf("resources of lease %s: %w", l.ID, err)
		}
		for _, rs := range res {
			if rs.Type != "content" {
				continue
			}
			sp := storedProof{on: digest.Digest(rs.ID)}
			info, err := cs.Info(ctx, sp.on)
			if err != nil && !errdefs.IsNotFound(err) {
				return nil, fmt.Errorf("content %s: %w", rs.ID, err)
			}
			if v := info.Labels[proofLabel(key)]; v != "" && json.Unmarshal([]byte(v), &sp.proof) == nil && sp.Ref != "" {
				sp.valid = sp.Digest == sp.on.String()
			}
			s.proofs = append(s.proofs, sp)
		}
	}
	return states, nil
}

// OnForeign sets f to hear of every record of a node-local name that
// gpupin did not write and that was replaced or removed (Action
// "foreign"), whichever step found it: Recover (the agent's pass, Pins)
// or a pin. The agent reports them; nil stops it.
func (r *Store) OnForeign(f func(Recovered)) {
	r.foreignMu.Lock()
	r.onForeign = f
	r.foreignMu.Unlock()
}

func (r *Store) reportForeign(done []Recovered) {
	r.foreignMu.Lock()
	f := r.onForeign
	r.foreignMu.Unlock()
	if f == nil {
		return
	}
	for _, d := range done {
		if d.Action == "foreign" {
			f(d)
		}
	}
}

// fixKey makes the key's proof, lease and local names follow its pin,
// restoring the pin from its proof when another client took it. The
// caller holds the key's pin lock.
func (r *Store) fixKey(ctx context.Context, key string) ([]Recovered, error) {
	done, err := r.fixKeyLocked(ctx, key)
	r.reportForeign(done)
	return done, err
}

func (r *Store) fixKeyLocked(ctx context.Context, key string) ([]Recovered, error) {
	states, err := r.keyStates(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", key, err)
	}
	s := states[key]
	if s == nil {
		return nil, nil
	}
	var out []Recovered
	cur := s.best()
	if p := s.toRestore(); p != nil {
		restored, action, why, err := r.restore(ctx, key, p.proof)
		if err != nil {
			return out, fmt.Errorf("restore the pin of %s (%s): %w", key, p.Ref, err)
		}
		if restored != nil {
			if cur != nil {
				// An older record of the key, left labelled by a pin step
				// cut short, steps back for the one restored.
				if err := r.demote(ctx, *cur, key); err != nil {
					return out, fmt.Errorf("pin %s: demote %s: %w", key, cur.Name, err)
				}
			}
			cur = restored
			out = append(out, Recovered{Key: key, Ref: p.Ref, Action: action, Detail: why})
		} else {
			out = append(out, Recovered{Key: key, Ref: p.Ref, Action: "dropped", Detail: why})
		}
	}
	if cur == nil {
		done, err := r.clearKey(ctx, key, s)
		return append(out, done...), err
	}
	done, err := r.keepProof(ctx, key, *cur, s)
	out = append(out, done...)
	if err != nil {
		return out, err
	}
	done, err = r.keepLocal(ctx, key, *cur, s.locals)
	return append(out, done...), err
}

// restore puts the record a proof names back as the key's pin: its labels
// on a record that lost them, or the record itself, from the content that
// the pin's lease kept. It returns nil and why, when the proof must not or
// cannot be restored.
func (r *Store) restore(ctx context.Context, key string, p proof) (*images.Image, string, string, error) {
	is := r.conn.Client.ImageService()
	labels := cloneLabels(p.Labels)
	labels[LabelRestored] = time.Now().UTC().Format(time.RFC3339)
	labels[LabelCRIPinned] = "pinned"
	labels[conn.LabelManaged] = "true"
	for range 2 {
		rec, err := is.Get(ctx, p.Ref)
		if err == nil {
			switch {
			case conn.Tampered(rec) || rec.Target.Digest.String() != p.Digest:
				return nil, "", fmt.Sprintf("%s points at %s now, not the image that was proved (%s): changed outside gpupin, never restored", p.Ref, rec.Target.Digest, p.Digest), nil
			case rec.Labels[LabelPrevious] == key:
				return nil, "", "its record was demoted (a newer pin, or unpin)", nil
			case rec.Labels[LabelPin] != "" && rec.Labels[LabelPin] != key:
				return nil, "", fmt.Sprintf("%s is the pin of %s now", p.Ref, rec.Labels[LabelPin]), nil
			}
			rec.Labels = labels
			updated, err := is.Update(ctx, rec, labelPaths(append(pinLabelKeys, conn.LabelCreated))...)
			if err != nil {
				return nil, "", "", err
			}
			return &updated, "relabelled", "a pull by another client had replaced its labels", nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, "", "", err
		}
		target := p.target()
		if _, err := r.conn.Client.ContentStore().Info(ctx, target.Digest); errdefs.IsNotFound(err) {
			return nil, "", "its record and content are gone: it is proved again", nil
		} else if err != nil {
			return nil, "", "", err
		}
		img := client.NewImageWithPlatform(r.conn.Client, images.Image{Name: p.Ref, Target: target}, platforms.Default())
		if ok, err := img.IsUnpacked(ctx, r.conn.Snapshotter); err != nil || !ok {
			if err := img.Unpack(ctx, r.conn.Snapshotter); err != nil {
				return nil, "", fmt.Sprintf("its record is gone and its content incomplete (%v): it is proved again", err), nil
			}
		}
		// Made by gpupin now, whoever made the record that went.
		labels[conn.LabelCreated] = "true"
		created, err := is.Create(ctx, images.Image{Name: p.Ref, Target: target, Labels: labels})
		if errdefs.IsAlreadyExists(err) {
			continue // made meanwhile (a pull): judged as a record that is there
		}
		if err != nil {
			return nil, "", "", err
		}
		return &created, "recreated", "its record had been deleted (kubelet's image GC, crictl rmi); its content remained", nil
	}
	return nil, "", "", fmt.Errorf("%s keeps appearing and going", p.Ref)
}

// keepProof writes cur's proof on its manifest, holds that in the key's
// lease, and drops every other proof of the key.
func (r *Store) keepProof(ctx context.Context, key string, cur images.Image, s *keyState) ([]Recovered, error) {
	var out []Recovered
	have := false
	for _, sp := range s.proofs {
		if sp.on == cur.Target.Digest && sp.valid && sp.matches(cur) {
			have = true
		}
	}
	if !have {
		v, err := proofOf(cur).encode(key)
		if err != nil {
			return out, err
		}
		info := content.Info{Digest: cur.Target.Digest, Labels: map[string]string{proofLabel(key): v}}
		if _, err := r.conn.Client.ContentStore().Update(ctx, info, "labels."+proofLabel(key)); err != nil {
			return out, fmt.Errorf("pin %s: write its proof on %s: %w", key, cur.Target.Digest, err)
		}
		if len(s.proofs) == 0 {
			out = append(out, Recovered{Key: key, Ref: cur.Name, Action: "proof"})
		}
	}
	ls := r.conn.Client.LeasesService()
	l := leases.Lease{ID: pinLeaseID(key)}
	if !s.lease {
		var err error
		l, err = ls.Create(ctx, leases.WithID(l.ID), leases.WithLabels(map[string]string{conn.LabelRole: PinLeaseRole, LabelPin: key}))
		if err != nil && !errdefs.IsAlreadyExists(err) {
			return out, fmt.Errorf("pin %s: lease for its content: %w", key, err)
		}
		l.ID = pinLeaseID(key)
	}
	if err := ls.AddResource(ctx, l, leases.Resource{ID: cur.Target.Digest.String(), Type: "content"}); err != nil && !errdefs.IsAlreadyExists(err) {
		return out, fmt.Errorf("pin %s: hold its content: %w", key, err)
	}
	for _, sp := range s.proofs {
		if sp.on == cur.Target.Digest {
			continue
		}
		if err := r.dropProof(ctx, key, l, sp.on); err != nil {
			return out, err
		}
	}
	return out, nil
}

// dropProof clears the key's proof from a manifest and lets the lease go
// of it; the manifest stays for whatever else holds it.
func (r *Store) dropProof(ctx context.Context, key string, l leases.Lease, on digest.Digest) error {
	info := content.Info{Digest: on, Labels: map[string]string{}}
	if _, err := r.conn.Client.ContentStore().Update(ctx, info, "labels."+proofLabel(key)); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("pin %s: clear its proof on %s: %w", key, on, err)
	}
	err := r.conn.Client.LeasesService().DeleteResource(ctx, l, leases.Resource{ID: on.String(), Type: "content"})
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("pin %s: let go of %s: %w", key, on, err)
	}
	return nil
}

// clearKey removes what a key without a pin still has: its proofs, its
// lease and its local names.
func (r *Store) clearKey(ctx context.Context, key string, s *keyState) ([]Recovered, error) {
	errs := []error{r.clearProofs(ctx, key, s)}
	var out []Recovered
	for _, l := range s.locals {
		rec := Recovered{Key: key, Ref: l.Name, Action: "cleared", Detail: "no pin: its local name is removed"}
		why := r.foreignLocal(ctx, key, l, nil)
		if why != "" {
			rec.Action, rec.Detail = "foreign", why+"; this node has no pin of "+key+": "
		}
		done, err := r.dropLocal(ctx, l, why != "")
		if err != nil {
			errs = append(errs, fmt.Errorf("pin %s: %w", key, err))
			continue
		}
		if rec.Action == "foreign" {
			rec.Detail += done
		}
		out = append(out, rec)
	}
	if len(out) == 0 && (s.lease || len(s.proofs) > 0) {
		out = append(out, Recovered{Key: key, Action: "cleared", Detail: "no pin: its proof and lease are removed"})
	}
	return out, errors.Join(errs...)
}

// clearProofs drops every proof of the key and deletes its lease: the
// first step of an unpin, so that nothing can restore what it takes.
func (r *Store) clearProofs(ctx context.Context, key string, s *keyState) error {
	l := leases.Lease{ID: pinLeaseID(key)}
	for _, sp := range s.proofs {
		if err := r.dropProof(ctx, key, l, sp.on); err != nil {
			return err
		}
	}
	if !s.lease {
		return nil
	}
	if err := r.conn.Client.LeasesService().Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("pin %s: delete the lease of its content: %w", key, err)
	}
	return nil
}

// localLabels are the labels of a local-name record of the pin cur.
func localLabels(key string, cur images.Image) map[string]string {
	return map[string]string{LabelLocal: key, LabelLocalPin: cur.Name, conn.LabelManaged: "true", conn.LabelCreated: "true",
		LabelCRIPinned: "pinned", LabelVariant: cur.Labels[LabelVariant]}
}

var localLabelKeys = []string{LabelLocal, LabelLocalPin, conn.LabelManaged, conn.LabelCreated, LabelCRIPinned, LabelVariant}

// strayKey gathers the records under the prefix that are no key's local
// name: nothing gpupin writes has such a name, so they are removed.
const strayKey = ""

// localNameKey is the key whose local name (under this store's prefix)
// is name: one of the keys known, or the ENGINE:VERSION the name spells;
// strayKey when none.
func (r *Store) localNameKey(name string, known map[string]*keyState) string {
	for k := range known {
		if k != strayKey && r.LocalName(k) == name {
			return k
		}
	}
	rest := strings.TrimPrefix(name, r.localPrefix+"/")
	if i := strings.LastIndex(rest, ":"); i > 0 && !strings.Contains(rest, "@") {
		if k := rest[:i] + ":" + rest[i+1:]; r.LocalName(k) == name {
			return k
		}
	}
	return strayKey
}

// foreignLocal says why l, a record of a local name of key, is not one
// gpupin wrote on this node; "" when it is. gpupin's marker names the pin
// record the local name stands for, and counts only while that record is
// (or was) the key's pin here, untampered, with l's target: a copy of
// another node's labels names a pin this node does not have, and a copy
// onto another image names a pin with another target. A record from
// before the marker (io.gpupin.local=key, no marker) on cur's own target
// is gpupin's: keepLocal marks it. cur is the key's pin, or nil.
func (r *Store) foreignLocal(ctx context.Context, key string, l images.Image, cur *images.Image) string {
	if l.Labels[LabelLocal] != key {
		return fmt.Sprintf("%s, on %s, was not written by gpupin (no %s label: a pull of the name, from a peer through a mirror, or ctr tag)",
			l.Name, l.Target.Digest, LabelLocal)
	}
	m := l.Labels[LabelLocalPin]
	if m == "" {
		if cur != nil && l.Target.Digest == cur.Target.Digest {
			return ""
		}
		return fmt.Sprintf("%s, on %s, carries no %s marker and is not on this node's pin of %s", l.Name, l.Target.Digest, LabelLocalPin, key)
	}
	rec, err := r.conn.Client.ImageService().Get(ctx, m)
	switch {
	case err != nil:
		return fmt.Sprintf("%s, on %s, names the pin %s, which this node does not have (labels copied from another node's record)", l.Name, l.Target.Digest, m)
	case conn.Tampered(rec) || rec.Target.Digest != l.Target.Digest:
		return fmt.Sprintf("%s is on %s, but the pin it names, %s, is on %s (labels copied onto another image)", l.Name, l.Target.Digest, m, rec.Target.Digest)
	case rec.Labels[LabelPin] != key && rec.Labels[LabelPrevious] != key:
		return fmt.Sprintf("%s names %s, which is no pin of %s on this node", l.Name, m, key)
	}
	return ""
}

// dropLocal removes a local-name record: gpupin's own, or any under the
// prefix, is deleted; a foreign one of another name (gpupin's labels
// copied onto someone's image) only loses gpupin's labels. It says which
// it did.
func (r *Store) dropLocal(ctx context.Context, l images.Image, foreign bool) (string, error) {
	is := r.conn.Client.ImageService()
	if !foreign || strings.HasPrefix(l.Name, r.localPrefix+"/") {
		if err := is.Delete(ctx, l.Name); err != nil && !errdefs.IsNotFound(err) {
			return "", fmt.Errorf("remove the local name %s: %w", l.Name, err)
		}
		return "removed", nil
	}
	l.Labels = nil
	if _, err := is.Update(ctx, l, labelPaths(localLabelKeys)...); err != nil && !errdefs.IsNotFound(err) {
		return "", fmt.Errorf("take gpupin's labels off %s: %w", l.Name, err)
	}
	return "gpupin's labels taken off it", nil
}

// keepLocal points the key's local names at cur: the one under this
// store's prefix, made if missing, and any another prefix made, so
// every name in use moves in the same step.
func (r *Store) keepLocal(ctx context.Context, key string, cur images.Image, locals []images.Image) ([]Recovered, error) {
	is := r.conn.Client.ImageService()
	own := r.LocalName(key)
	want := localLabels(key, cur)
	var out []Recovered
	ownFound := own == ""
	for _, l := range locals {
		if l.Target.Digest == cur.Target.Digest && l.Target.MediaType == cur.Target.MediaType && sameLabels(l.Labels, want) {
			ownFound = ownFound || l.Name == own
			continue
		}
		rec := Recovered{Key: key, Ref: l.Name, Action: "local", Detail: "now " + cur.Name}
		paths := append([]string{"target"}, labelPaths(localLabelKeys)...)
		if why := r.foreignLocal(ctx, key, l, &cur); why != "" {
			// Every label goes: ctr tag copies a candidate's role and owner.
			paths = []string{"target", "labels"}
			rec.Action = "foreign"
			if l.Name != own && !strings.HasPrefix(l.Name, r.localPrefix+"/") {
				// Not a name of gpupin's: it is let go, never repointed.
				done, err := r.dropLocal(ctx, l, true)
				if err != nil {
					return out, fmt.Errorf("pin %s: %w", key, err)
				}
				rec.Detail = why + ": " + done
				out = append(out, rec)
				continue
			}
			rec.Detail = why + ": replaced by this node's own, on " + cur.Name
		}
		ownFound = ownFound || l.Name == own
		l.Target, l.Labels = cur.Target, want
		if _, err := is.Update(ctx, l, paths...); err != nil {
			return out, fmt.Errorf("pin %s: move the local name %s: %w", key, l.Name, err)
		}
		out = append(out, rec)
	}
	if ownFound {
		return out, nil
	}
	rec := Recovered{Key: key, Ref: own, Action: "local", Detail: "now " + cur.Name}
	_, err := is.Create(ctx, images.Image{Name: own, Target: cur.Target, Labels: want})
	if errdefs.IsAlreadyExists(err) {
		// A record of that name made since the key's records were read,
		// not by gpupin: the name is under gpupin's prefix, so it is
		// taken over.
		rec.Action, rec.Detail = "foreign", own+" appeared, not written by gpupin: replaced by this node's own, on "+cur.Name
		_, err = is.Update(ctx, images.Image{Name: own, Target: cur.Target, Labels: want}, "target", "labels")
	}
	if err != nil {
		return out, fmt.Errorf("pin %s: make the local name %s: %w", key, own, err)
	}
	return append(out, rec), nil
}

// removeStrays removes the records under the prefix that are no key's
// local name (a name gpupin never writes, pulled or made by hand).
func (r *Store) removeStrays(ctx context.Context, strays []images.Image) (out []Recovered, err error) {
	defer func() { r.reportForeign(out) }()
	var errs []error
	for _, l := range strays {
		if err := r.conn.Client.ImageService().Delete(ctx, l.Name); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove %s: %w", l.Name, err))
			continue
		}
		out = append(out, Recovered{Ref: l.Name, Action: "foreign", Detail: fmt.Sprintf(
			"%s, on %s, is under gpupin's local prefix but is no local name gpupin writes (a pull of the name, or made by hand): removed", l.Name, l.Target.Digest)})
	}
	return out, errors.Join(errs...)
}

func sameLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// localNames maps each key to the local names that point at its pin,
// this store's own prefix first.
func (r *Store) localNames(ctx context.Context) (map[string][]images.Image, error) {
	imgs, err := r.conn.Client.ImageService().List(ctx, fmt.Sprintf(`labels.%q`, LabelLocal))
	if err != nil {
		return nil, fmt.Errorf("list local names: %w", err)
	}
	out := map[string][]images.Image{}
	for _, img := range imgs {
		k := img.Labels[LabelLocal]
		out[k] = append(out[k], img)
	}
	for k, v := range out {
		own := r.LocalName(k)
		sort.SliceStable(v, func(i, j int) bool { return v[i].Name == own && v[j].Name != own })
		out[k] = v
	}
	return out, nil
}
