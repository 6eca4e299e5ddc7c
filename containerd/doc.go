// Package containerd is gpupin's side of containerd: pulling candidates by
// digest, running probe and replica containers, and keeping pins as labels
// on image records. containerd is the database; there is no state file.
//
// Start with Connect. Pull fetches and unpacks a candidate by digest under
// a staging name, inside WithLease; Run runs a container to its end (the
// hardened box for probes); SetPin makes a pin with one label update and
// demotes the key's other records, and Pins lists them (restoring any
// another client took). FindPin and PinToRun say what a replica runs;
// GC and Sweep clean up after gpupin. provision drives all of it.
package containerd
