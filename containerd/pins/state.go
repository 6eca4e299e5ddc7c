package pins

import (
	"context"
	"fmt"
	"regexp"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd/conn"
)

// What containerd holds for the keys, read into plain values: the reads
// Recover, a pin and unpin decide on (decide.go). Nothing here writes.

// keyState is what containerd holds for one key.
type keyState struct {
	pins []images.Image // records labelled io.gpupin.pin=key
	// locals are the records labelled io.gpupin.local=key, and a record
	// of the key's local name under this store's prefix that is not
	// (foreign: a pull of the name, ctr tag).
	locals []images.Image
	lease  bool
	proofs []storedProof
	// marked are the records the locals' markers (io.gpupin.local.pin)
	// name, by name; a name missing here is a record this namespace does
	// not have. Read by readMarked, for the key being repaired only.
	marked map[string]images.Image
	// lost are the local names whose marker names a missing record while
	// their own target content is gone too: the pin's image was lost
	// here, not copied from elsewhere (a copy brings its content).
	lost map[string]bool
}

// keyStates reads what containerd holds for every key, or for one: the
// records labelled with a key, the records named under the prefix, and
// the pin leases with the proofs on what they hold.
func (r *Store) keyStates(ctx context.Context, only string) (map[string]*keyState, error) {
	states := stateByKey{}
	if err := r.readLabelled(ctx, only, states); err != nil {
		return nil, err
	}
	if err := r.readNamed(ctx, only, states); err != nil {
		return nil, err
	}
	if err := r.readProofs(ctx, only, states); err != nil {
		return nil, err
	}
	return states, nil
}

// stateByKey holds the keys' states as they are read.
type stateByKey map[string]*keyState

func (m stateByKey) of(key string) *keyState {
	s := m[key]
	if s == nil {
		s = &keyState{}
		m[key] = s
	}
	return s
}

// readLabelled reads the records labelled with a key (only, or any):
// its pins (io.gpupin.pin) and its local names (io.gpupin.local).
func (r *Store) readLabelled(ctx context.Context, only string, states stateByKey) error {
	is := r.conn.Client.ImageService()
	filter := func(label string) string {
		if only != "" {
			return fmt.Sprintf(`labels.%q==%q`, label, only)
		}
		return fmt.Sprintf(`labels.%q`, label)
	}
	pins, err := is.List(ctx, filter(LabelPin))
	if err != nil {
		return fmt.Errorf("list pins: %w", err)
	}
	for _, img := range pins {
		s := states.of(img.Labels[LabelPin])
		s.pins = append(s.pins, img)
	}
	locals, err := is.List(ctx, filter(LabelLocal))
	if err != nil {
		return fmt.Errorf("list local names: %w", err)
	}
	for _, img := range locals {
		s := states.of(img.Labels[LabelLocal])
		s.locals = append(s.locals, img)
	}
	return nil
}

// readNamed reads the records under the prefix that carry no
// io.gpupin.local label: nobody's local name, yet pods that name it run
// it (a pull of the name, through a peer-to-peer mirror that serves
// another node's record; ctr tag). Each joins the key whose name it has,
// or the strays. Run after readLabelled, whose keys it knows.
func (r *Store) readNamed(ctx context.Context, only string, states stateByKey) error {
	is := r.conn.Client.ImageService()
	var named []images.Image
	if only != "" {
		img, err := is.Get(ctx, r.LocalName(only))
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("get the local name of %s: %w", only, err)
		}
		if err == nil {
			named = append(named, img)
		}
	} else {
		var err error
		named, err = is.List(ctx, fmt.Sprintf("name~=%q", "^"+regexp.QuoteMeta(r.localPrefix+"/")))
		if err != nil {
			return fmt.Errorf("list records under %s/: %w", r.localPrefix, err)
		}
	}
	for _, img := range named {
		l := img.Labels
		if l[LabelLocal] != "" {
			continue // read by readLabelled
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
		s := states.of(key)
		s.locals = append(s.locals, img)
	}
	return nil
}

// readProofs reads the pin leases (of only, or every key) and the proof
// label on each manifest they hold.
func (r *Store) readProofs(ctx context.Context, only string, states stateByKey) error {
	ls := r.conn.Client.LeasesService()
	lf := fmt.Sprintf(`labels.%q==%q`, conn.LabelRole, PinLeaseRole)
	if only != "" {
		lf = fmt.Sprintf("id==%q", pinLeaseID(only))
	}
	held, err := ls.List(ctx, lf)
	if err != nil {
		return fmt.Errorf("list pin leases: %w", err)
	}
	cs := r.conn.Client.ContentStore()
	for _, l := range held {
		key := l.Labels[LabelPin]
		if key == "" || l.ID != pinLeaseID(key) {
			continue // not one of ours, whatever its labels say
		}
		s := states.of(key)
		s.lease = true
		res, err := ls.ListResources(ctx, l)
		if err != nil {
			return fmt.Errorf("resources of lease %s: %w", l.ID, err)
		}
		for _, rs := range res {
			if rs.Type != "content" {
				continue
			}
			on := digest.Digest(rs.ID)
			info, err := cs.Info(ctx, on)
			if err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("content %s: %w", rs.ID, err)
			}
			s.proofs = append(s.proofs, decodeProof(on, info.Labels[proofLabel(key)]))
		}
	}
	return nil
}

// readMarked reads into s.marked the records the markers of s's local
// names name, so foreignLocal can judge each local name without asking
// containerd itself. A record listed with the key's pins is taken from
// there; another is looked up. One that cannot be read counts as one this
// namespace does not have.
func (r *Store) readMarked(ctx context.Context, s *keyState) {
	s.marked = map[string]images.Image{}
	for _, l := range s.locals {
		m := l.Labels[LabelLocalPin]
		if m == "" {
			continue
		}
		if _, ok := s.marked[m]; ok {
			continue
		}
		if rec, ok := recordNamed(s.pins, m); ok {
			s.marked[m] = rec
			continue
		}
		if rec, err := r.conn.Client.ImageService().Get(ctx, m); err == nil {
			s.marked[m] = rec
			continue
		}
		if _, err := r.conn.Client.ContentStore().Info(ctx, l.Target.Digest); errdefs.IsNotFound(err) {
			if s.lost == nil {
				s.lost = map[string]bool{}
			}
			s.lost[l.Name] = true
		}
	}
}

func recordNamed(imgs []images.Image, name string) (images.Image, bool) {
	for _, img := range imgs {
		if img.Name == name {
			return img, true
		}
	}
	return images.Image{}, false
}
