// Package run runs containers to their end: the probe's hardened box and
// the replicas that serve, with their GPUs.
//
// Start with Runner.Run (run.go). The OCI spec a run gets (the box, the
// limits, the syscall filter) is spec.go; how GPUs reach it (CDI, the
// nvidia runtime) is gpu.go; waiting for a task and killing it is task.go;
// and the probes an interrupted gpupin left are swept by sweep.go.
package run

import "github.com/gpupin/gpupin/containerd/conn"

// Runner runs containers in one containerd namespace.
type Runner struct {
	conn     *conn.Conn
	runcRoot string
	fifoDir  string
	cdiDirs  []string
}

// New is a Runner over c: runc keeps its state under runcRoot ("" is
// runc's own), the containers' stdio FIFOs are made in fifoDir, and CDI
// specs are read from cdiDirs.
func New(c *conn.Conn, runcRoot, fifoDir string, cdiDirs []string) *Runner {
	return &Runner{conn: c, runcRoot: runcRoot, fifoDir: fifoDir, cdiDirs: cdiDirs}
}
