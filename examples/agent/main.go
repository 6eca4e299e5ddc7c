// Command agent shows how a gateway's node agent uses gpupin as a library:
// it wants two engines, lets a provision.Loop keep them converged, and
// starts (here: prints) replicas from the pinned digests it is handed.
//
//	go run ./examples/agent -vllm reg.example/org/vllm:0.11.0 -sglang reg.example/org/sglang:0.5.0
//
// With -node FILE (what `gpupin detect --json` prints) it runs on
// simulated node facts, where there is no GPU.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupin/gpupin/node"
	"github.com/gpupin/gpupin/provision"
	"github.com/gpupin/gpupin/runtime"
)

func main() {
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd socket")
	namespace := flag.String("namespace", "k8s.io", "containerd namespace (k8s.io: kubelet sees and keeps the pins)")
	nodeFile := flag.String("node", "", "simulated node facts (JSON); default: NVML")
	vllm := flag.String("vllm", "registry.example/org/vllm:0.11.0", "vLLM image (an index of CUDA variants)")
	sglang := flag.String("sglang", "registry.example/org/sglang:0.5.0", "SGLang image")
	flag.Parse()
	if err := run(*address, *namespace, *nodeFile, *vllm, *sglang); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run(address, namespace, nodeFile, vllm, sglang string) error {
	// SIGTERM ends the loop; Run returns once in-flight provisions have
	// cleaned up, so the process never leaves a half-made pin.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rt, err := runtime.Connect(ctx, address, runtime.WithNamespace(namespace))
	if err != nil {
		return err
	}
	defer rt.Close()
	opts := []provision.Option{provision.WithLogger(slog.Default())}
	if nodeFile != "" {
		opts = append(opts, provision.WithNode(node.File(nodeFile)))
	}
	// The defaults are the CLI's: NVML, /etc/gpupin/overrides.yaml, and the
	// lock directory `gpupin provision` shares, so the two never collide.
	p := provision.New(rt, opts...)
	loop := provision.NewLoop(p, provision.LoopOptions{
		// Called once per change, never per pass: the place to (re)start
		// replicas from st.Pinned, or to drain them when an engine fails
		// or is disabled on this node.
		OnChange: func(st provision.Status) {
			switch st.State {
			case provision.Ready:
				fmt.Printf("%s: start replicas from %s (%s)\n", st.Key, st.Pinned, st.Variant)
			case provision.Failed, provision.Disabled, provision.Unsupported:
				fmt.Printf("%s: no replicas here: %s\n", st.Key, st.Detail)
			}
		},
		Logger: slog.Default(),
	})
	// The gateway's own view of what this node should serve; call SetWants
	// again whenever it changes: the loop acts on it at once.
	if err := loop.SetWants([]provision.Want{
		{Engine: "vllm", Ref: vllm}, // the version comes from the image's metadata
		{Engine: "sglang", Ref: sglang, Override: "auto"},
	}); err != nil {
		return err
	}
	return loop.Run(ctx)
}
