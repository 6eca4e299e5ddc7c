// Command gpupin-sandbox starts the real parts gpupin talks to, privately,
// for `make demo` and benchmarks: a containerd daemon in a temporary root
// and a registry on loopback holding a demo engine. It writes the settings
// as shell variables to --env-file and runs until it is signalled.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/gpupin/gpupin/internal/sandbox"
)

func main() {
	envFile := flag.String("env-file", "", "write CONTAINERD_ADDRESS and the registry's host here, as shell variables")
	blobDir := flag.String("blob-dir", "", "keep the registry's blobs on disk here (default: memory)")
	demo := flag.Bool("demo-engine", true, "publish the demo engine (cu13 whose simulated probe fails, cu129)")
	flag.Parse()
	if err := run(*envFile, *blobDir, *demo); err != nil {
		fmt.Fprintln(os.Stderr, "gpupin-sandbox:", err)
		os.Exit(1)
	}
}

func run(envFile, blobDir string, demo bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := sandbox.StartContainerd(ctx, sandbox.ContainerdOptions{})
	if err != nil {
		return err
	}
	defer d.Stop()
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{BlobDir: blobDir})
	if err != nil {
		return err
	}
	defer reg.Close()
	if demo {
		// cu13 is built so that its (simulated) probe fails: the demo shows
		// the fallback to cu129 and the reason cu13 was passed over.
		variants := []sandbox.EngineVariant{
			{Name: "cu129", CUDA: "12.9", Archs: "7.0,7.5,8.0,8.6,8.9,9.0+PTX"},
			{Name: "cu13", CUDA: "13.0", Archs: "7.5,8.0,8.6,8.9,9.0,10.0,12.0+PTX", SimProbe: "fail"},
		}
		if _, err := sandbox.PublishEngine(ctx, reg.Host, "demo-engine", "1.0.0", variants); err != nil {
			return fmt.Errorf("publish the demo engine: %w", err)
		}
	}
	if envFile != "" {
		vars := fmt.Sprintf("CONTAINERD_ADDRESS=%s\nGPUPIN_RUNC_ROOT=%s\nGPUPIN_REGISTRY=%s\nGPUPIN_SANDBOX_DIR=%s\n",
			d.Address, d.RuncRoot, reg.Host, d.Dir)
		tmp := envFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(vars), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Clean(envFile)); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "gpupin-sandbox: containerd at %s, registry at %s; waiting for a signal\n", d.Address, reg.Host)
	<-ctx.Done()
	return nil
}
