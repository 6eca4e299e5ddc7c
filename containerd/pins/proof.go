package pins

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/gpupin/gpupin/containerd/conn"
)

// A pin's proof: what a content label keeps of a pin record, so that
// Recover can put the record back (recover.go). This file is the encoding
// alone: no daemon, no clock; proof_test.go holds it to its table.

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

// storedProof is a proof and the content it is a label of.
type storedProof struct {
	proof
	on    digest.Digest
	valid bool // false: the label is missing or does not parse
}

// decodeProof reads the label value v found on the content on. A value
// that is missing, does not parse, names no record, or names a digest
// other than the content it is on is kept, but not valid: the lease holds
// content whose proof cannot be trusted.
func decodeProof(on digest.Digest, v string) storedProof {
	sp := storedProof{on: on}
	if v != "" && json.Unmarshal([]byte(v), &sp.proof) == nil && sp.Ref != "" {
		sp.valid = sp.Digest == on.String()
	}
	return sp
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

// restoredLabels are the labels a record restored from p gets: the
// proof's, marked as restored at now, pinned for kubelet, and gpupin's.
func (p proof) restoredLabels(now time.Time) map[string]string {
	labels := cloneLabels(p.Labels)
	labels[LabelRestored] = now.UTC().Format(time.RFC3339)
	labels[LabelCRIPinned] = "pinned"
	labels[conn.LabelManaged] = "true"
	return labels
}
