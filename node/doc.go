// Package node holds the facts about a node that the choice of a variant
// rests on: the NVIDIA driver, the CUDA version it supports, and every GPU
// with its compute capability; Facts.Fingerprint is what a pin records.
//
// Start with NewReader, which reads NVML (a build without cgo says so, and
// reports the node unsupported). File reads the facts from a JSON file
// instead (what `gpupin detect --json` prints), marked simulated; Static
// serves fixed facts. Each is a Reader, what provision.WithNode takes.
package node
