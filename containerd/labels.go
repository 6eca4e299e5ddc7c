package containerd

import (
	"github.com/gpupin/gpupin/containerd/conn"
	"github.com/gpupin/gpupin/containerd/pins"
)

// The labels gpupin puts on what it makes: the contract other programs
// read (docs/architecture.md). Each is defined by the part it belongs to.
const (
	LabelManaged = conn.LabelManaged
	LabelOwner   = conn.LabelOwner
	LabelRole    = conn.LabelRole
	LabelCreated = conn.LabelCreated
	LabelSource  = conn.LabelSource

	LabelPin       = pins.LabelPin
	LabelVariant   = pins.LabelVariant
	LabelNode      = pins.LabelNode
	LabelProbedAt  = pins.LabelProbedAt
	LabelProbe     = pins.LabelProbe
	LabelVerdict   = pins.LabelVerdict
	LabelOverride  = pins.LabelOverride
	LabelSimulated = pins.LabelSimulated
	LabelPrevious  = pins.LabelPrevious
	LabelCRIPinned = pins.LabelCRIPinned
	LabelLocal     = pins.LabelLocal
	LabelLocalPin  = pins.LabelLocalPin
	LabelRestored  = pins.LabelRestored
)

// OwnerOf is the owner label (io.gpupin.owner) a process of this pid
// namespace puts on what it makes (conn.OwnerOf).
func OwnerOf(pid int) string { return conn.OwnerOf(pid) }
