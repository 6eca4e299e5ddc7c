// Command agent is what a gateway's node agent writes to use gpupin: it
// wants an engine, and starts (here: prints) replicas from the image each
// node proved. agent.Run's defaults are the CLI's: NVML, the operator's
// /etc/gpupin/overrides.yaml, the lock directory `gpupin provision`
// shares, and a pass every 30 s that restores pins kubelet's GC took.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupin/gpupin/agent"
	"github.com/gpupin/gpupin/containerd"
	"github.com/gpupin/gpupin/provision"
)

func main() {
	// SIGTERM: Run returns once in-flight provisions have cleaned up.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rt, err := containerd.Connect(ctx, "/run/containerd/containerd.sock", containerd.WithNamespace("k8s.io"))
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	err = agent.Run(ctx, agent.RunConfig{
		Runtime: rt,
		Wants:   []provision.Want{{Ref: "registry.example/org/vllm:0.11.0"}},
		// Called once per change: (re)start replicas from st.Pinned (or
		// gpupin.local/ENGINE:VERSION), drain them when it is not ready.
		Loop: provision.LoopOptions{OnChange: func(st provision.Status) {
			fmt.Printf("%s: %s %s\n", st.Key, st.State, st.Pinned)
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
}
