package pins

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
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
//     and labels (proof.go). A pull only adds its garbage-collection and
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
//
// Recover reads, decides, then acts, each in its own file: state.go reads
// what containerd holds into plain values (keyState), decide.go decides
// from those values alone (best, newest, toRestore, settled, foreignLocal,
// the plans for proofs and local names) and names what is done (action),
// and repair.go and local.go carry the decisions out.

// Recovered is one repair Recover made.
type Recovered struct {
	Key string `json:"key"`
	Ref string `json:"ref,omitempty"`
	// Action is what was done (an action's name, decide.go):
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
		if states[key].settled(key, r.LocalName(key)) {
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
		if d.Action == actForeign.String() {
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

// fixKeyLocked reads the key, decides and acts: first whether its pin is
// to be restored (which decides the record that stands), then what that
// record's proof, lease and local names need, or, with no pin, what is to
// be cleared.
func (r *Store) fixKeyLocked(ctx context.Context, key string) ([]Recovered, error) {
	states, err := r.keyStates(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", key, err)
	}
	s := states[key]
	if s == nil {
		return nil, nil
	}
	r.readMarked(ctx, s)
	var out []Recovered
	cur := s.best()
	if p := s.toRestore(); p != nil {
		restored, act, why, err := r.restore(ctx, key, p.proof)
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
			// What was read of the record is what it was before: a local
			// name's marker is judged on the record as restored.
			s.marked[restored.Name] = *restored
			out = append(out, act.report(key, p.Ref, why))
		} else {
			out = append(out, actDropped.report(key, p.Ref, why))
		}
	}
	n := localNaming{own: r.LocalName(key), prefix: r.localPrefix}
	if cur == nil {
		done, err := r.clearKey(ctx, key, s, planClearLocal(key, n, s.locals, s.marked, s.lost))
		return append(out, done...), err
	}
	done, err := r.keepProof(ctx, key, *cur, planProof(*cur, s))
	out = append(out, done...)
	if err != nil {
		return out, err
	}
	done, err = r.keepLocal(ctx, key, planKeepLocal(key, n, *cur, s.locals, s.marked, s.lost))
	return append(out, done...), err
}
