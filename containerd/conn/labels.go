package conn

// Labels gpupin puts on what it creates, so it can find it again. The pin
// labels are the pin store's (pins/pin.go); these are every part's.
const (
	LabelManaged = "io.gpupin.managed" // on every record gpupin made
	LabelOwner   = "io.gpupin.owner"   // pid:starttime:pidns of the process that made a transient record
	LabelRole    = "io.gpupin.role"    // candidate, probe, replica
	// LabelCreated marks image records gpupin created itself; gc deletes
	// only those, and only lets go of records it adopted (a record kubelet
	// pulled that gpupin then proved and pinned).
	LabelCreated = "io.gpupin.created"
	// LabelSource is the reference asked for: on a pin, and on the leases
	// of what a pull keeps for its retry or fetched ahead.
	LabelSource = "io.gpupin.source"
)
