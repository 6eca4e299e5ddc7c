// Package probe holds the compute probes that prove an image on the node's
// GPUs, and the verdict they report. It runs nothing: provision runs the
// program it builds in a container of the image.
//
// Start with Select, which names an image's probe (torch, cuda or exec;
// sim for test fixtures), then Build, which stages that probe's Program
// (argv, environment, bind mounts), simulated mode included. Parse reads
// the container's output and exit code into a Verdict, or a *Failure that
// says why not. The protocol is docs/probe-protocol.md.
package probe
