package pins

import (
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/opencontainers/go-digest"

	"github.com/gpupin/gpupin/containerd/conn"
)

// The decisions: what Recover, a pin and unpin do about one key, from the
// values state.go read. Each takes values and calls nothing (no daemon, no
// clock); repair.go and local.go carry them out; decide_test.go holds
// them to tables.

// action is what one repair did, as Recovered.Action reports it.
type action int

const (
	actRelabelled action = iota + 1 // the pin's labels are back on a record pulled over
	actRecreated                    // the pin's record is back, from content that remained
	actDropped                      // a proof that cannot be restored is gone
	actProof                        // a pin without a proof got one
	actLocal                        // the key's local name was made or moved to its pin
	actCleared                      // a key without a pin lost its local names and lease
	actForeign                      // a record of a local name gpupin did not write here was replaced or removed
)

var actionNames = [...]string{
	actRelabelled: "relabelled",
	actRecreated:  "recreated",
	actDropped:    "dropped",
	actProof:      "proof",
	actLocal:      "local",
	actCleared:    "cleared",
	actForeign:    "foreign",
}

// String is the action's name in Recovered.Action.
func (a action) String() string {
	if a > 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// report is the Recovered that says a was done to ref.
func (a action) report(key, ref, detail string) Recovered {
	return Recovered{Key: key, Ref: ref, Action: a.String(), Detail: detail}
}

// best is the newest untampered record labelled with the key.
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
func (s *keyState) current() *images.Image {
	if s.toRestore() != nil {
		return nil // the record the proof names must be looked at
	}
	return s.best()
}

// settled reports whether the key needs nothing: its pin has exactly its
// own proof, and its local names point at it (own, the key's name under
// this store's prefix, among them); or it has no pin and nothing else
// either.
func (s *keyState) settled(key, own string) bool {
	best := s.current()
	if best == nil {
		return len(s.locals) == 0 && !s.lease && len(s.proofs) == 0
	}
	if !s.lease || len(s.proofs) != 1 || !s.proofs[0].valid || s.proofs[0].on != best.Target.Digest || !s.proofs[0].matches(*best) {
		return false
	}
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

// whyNotRestore says why rec, the record a proof p of key names as it is
// now, must not be given the pin's labels back; "" when it is to be.
func whyNotRestore(key string, p proof, rec images.Image) string {
	switch {
	case conn.Tampered(rec) || rec.Target.Digest.String() != p.Digest:
		return fmt.Sprintf("%s points at %s now, not the image that was proved (%s): changed outside gpupin, never restored", p.Ref, rec.Target.Digest, p.Digest)
	case rec.Labels[LabelPrevious] == key:
		return "its record was demoted (a newer pin, or unpin)"
	case rec.Labels[LabelPin] != "" && rec.Labels[LabelPin] != key:
		return fmt.Sprintf("%s is the pin of %s now", p.Ref, rec.Labels[LabelPin])
	}
	return ""
}

// proofPlan is what keeps a pin's proof and lease in step with it.
type proofPlan struct {
	write  bool            // the pin's own proof is missing or stale: write it on its manifest
	report bool            // the key had no proof at all: say so (actProof) once written
	lease  bool            // the key's lease is missing: make it
	drop   []digest.Digest // the key's proofs on other manifests: cleared and let go
}

// planProof decides what cur, the key's pin, needs of its proof and lease.
func planProof(cur images.Image, s *keyState) proofPlan {
	var p proofPlan
	have := false
	for _, sp := range s.proofs {
		if sp.on == cur.Target.Digest {
			have = have || (sp.valid && sp.matches(cur))
			continue
		}
		p.drop = append(p.drop, sp.on)
	}
	p.write = !have
	p.report = !have && len(s.proofs) == 0
	p.lease = !s.lease
	return p
}

// foreignLocal says why l, a record of a local name of key, is not one
// gpupin wrote on this node; "" when it is. gpupin's marker names the pin
// record the local name stands for, and counts only while that record is
// (or was) the key's pin here, untampered, with l's target: a copy of
// another node's labels names a pin this node does not have, and a copy
// onto another image names a pin with another target. A record from
// before the marker (io.gpupin.local=key, no marker) on cur's own target
// is gpupin's: keepLocal marks it. cur is the key's pin, or nil; marked
// holds the records markers name (keyState.marked), as they are now, and
// lost the local names whose pin record went with their content
// (keyState.lost).
func foreignLocal(key string, l images.Image, cur *images.Image, marked map[string]images.Image, lost map[string]bool) string {
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
	rec, ok := marked[m]
	switch {
	case !ok && lost[l.Name]:
		// The pin was here and its image went, record and content (a
		// content prune after the record's removal): its local name is
		// gpupin's own, and goes with it.
		return ""
	case !ok:
		return fmt.Sprintf("%s, on %s, names the pin %s, which this node does not have (labels copied from another node's record)", l.Name, l.Target.Digest, m)
	case conn.Tampered(rec) || rec.Target.Digest != l.Target.Digest:
		return fmt.Sprintf("%s is on %s, but the pin it names, %s, is on %s (labels copied onto another image)", l.Name, l.Target.Digest, m, rec.Target.Digest)
	case rec.Labels[LabelPin] != key && rec.Labels[LabelPrevious] != key:
		return fmt.Sprintf("%s names %s, which is no pin of %s on this node", l.Name, m, key)
	}
	return ""
}

// localOp is what one step does to a local-name record.
type localOp int

const (
	localMove    localOp = iota + 1 // point it at the pin, with gpupin's labels
	localReplace                    // point it at the pin, every label replaced: a foreign record of gpupin's name
	localCreate                     // make the store's own local name of the pin
	localDelete                     // remove the record
	localUnlabel                    // take gpupin's labels off: a foreign record of a name not gpupin's
)

var localOpNames = [...]string{localMove: "move", localReplace: "replace", localCreate: "create", localDelete: "delete", localUnlabel: "unlabel"}

func (o localOp) String() string {
	if o > 0 && int(o) < len(localOpNames) {
		return localOpNames[o]
	}
	return fmt.Sprintf("localOp(%d)", int(o))
}

// localStep is one repair of a local-name record.
type localStep struct {
	op localOp
	// rec is the record as it is to be (move, replace, create) or as it
	// is (delete, unlabel).
	rec  images.Image
	done Recovered // what is reported once the step is done
}

// Details of the local-name steps that say what was done.
const (
	localRemoved   = "removed"
	localUnlabeled = "gpupin's labels taken off it"
)

// localNaming is how a store names local names: own is the key's name under
// the store's prefix ("" when the key makes none).
type localNaming struct {
	own    string
	prefix string
}

// ours reports whether name is under the store's prefix, where no record
// is anyone's but gpupin's.
func (n localNaming) ours(name string) bool { return strings.HasPrefix(name, n.prefix+"/") }

// planKeepLocal points the key's local names at cur: the one under this
// store's prefix, made if missing, and any another prefix made, so every
// name in use moves in the same step. A foreign record of gpupin's name is
// replaced by the node's own; one of another name is let go, never
// repointed.
func planKeepLocal(key string, n localNaming, cur images.Image, locals []images.Image, marked map[string]images.Image, lost map[string]bool) []localStep {
	want := localLabels(key, cur)
	var steps []localStep
	ownFound := n.own == ""
	for _, l := range locals {
		if l.Target.Digest == cur.Target.Digest && l.Target.MediaType == cur.Target.MediaType && sameLabels(l.Labels, want) {
			ownFound = ownFound || l.Name == n.own
			continue
		}
		st := localStep{op: localMove, done: actLocal.report(key, l.Name, "now "+cur.Name)}
		if why := foreignLocal(key, l, &cur, marked, lost); why != "" {
			if l.Name != n.own && !n.ours(l.Name) {
				steps = append(steps, localStep{op: localUnlabel, rec: l, done: actForeign.report(key, l.Name, why+": "+localUnlabeled)})
				continue
			}
			// Every label goes: ctr tag copies a candidate's role and owner.
			st.op = localReplace
			st.done = actForeign.report(key, l.Name, why+": replaced by this node's own, on "+cur.Name)
		}
		ownFound = ownFound || l.Name == n.own
		l.Target, l.Labels = cur.Target, want
		st.rec = l
		steps = append(steps, st)
	}
	if !ownFound {
		steps = append(steps, localStep{op: localCreate, rec: images.Image{Name: n.own, Target: cur.Target, Labels: want},
			done: actLocal.report(key, n.own, "now "+cur.Name)})
	}
	return steps
}

// planClearLocal removes the local names of a key without a pin: gpupin's
// own, or any under the prefix, is deleted; a foreign one of another name
// (gpupin's labels copied onto someone's image) only loses gpupin's
// labels.
func planClearLocal(key string, n localNaming, locals []images.Image, marked map[string]images.Image, lost map[string]bool) []localStep {
	var steps []localStep
	for _, l := range locals {
		why := foreignLocal(key, l, nil, marked, lost)
		switch {
		case why == "":
			steps = append(steps, localStep{op: localDelete, rec: l, done: actCleared.report(key, l.Name, "no pin: its local name is removed")})
		case n.ours(l.Name):
			steps = append(steps, localStep{op: localDelete, rec: l, done: actForeign.report(key, l.Name, why+"; this node has no pin of "+key+": "+localRemoved)})
		default:
			steps = append(steps, localStep{op: localUnlabel, rec: l, done: actForeign.report(key, l.Name, why+"; this node has no pin of "+key+": "+localUnlabeled)})
		}
	}
	return steps
}
