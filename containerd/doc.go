// Package containerd is gpupin's side of containerd: pulling candidates by
// digest, running probe and replica containers, and keeping pins as labels
// on image records. containerd is the database; there is no state file.
//
// This package is the front: Connect makes a Runtime, and its methods hand
// each call to the part that does it:
//
//   - pull: the pull engine (Pull, Prefetch, LayerStorage);
//   - pins: the pin store (SetPin, Pins, FindPin, PinToRun, Unpin,
//     Recover, the node-local names, CRIPinning, Sweep, GC);
//   - run: running containers (Run, the probe's hardened box, GPUs);
//   - conn: what the three share (the connection, labels, owners, leases).
//
// The types callers name (Pin, RunSpec, PullOptions, …) are aliases of the
// parts' own, so a caller needs only this package. Start with Connect.
// Pull fetches and unpacks a candidate by digest under a staging name,
// inside WithLease; Run runs a container to its end (the hardened box for
// probes); SetPin makes a pin with one label update and demotes the key's
// other records, and Pins lists them (restoring any another client took).
// FindPin and PinToRun say what a replica runs; GC and Sweep clean up
// after gpupin. provision drives all of it.
package containerd
