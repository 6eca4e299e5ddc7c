//go:build gpupinexp

package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	gimages "github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/internal/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := sandbox.StartContainerd(ctx, sandbox.ContainerdOptions{Bin: os.Getenv("CTD")})
	if err != nil {
		panic(err)
	}
	defer d.Stop()
	reg, err := sandbox.StartRegistry(sandbox.RegistryOptions{BlobDir: "/var/tmp/gpupin-bench/blobs"})
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	var layers []v1.Layer
	for _, f := range os.Args[1:] {
		l, err := tarball.LayerFromFile(f) // gz blob files; digest computed
		if err != nil {
			panic(err)
		}
		layers = append(layers, l)
	}
	if _, err := sandbox.PublishEngine(ctx, reg.Host, "real", "1.0", []sandbox.EngineVariant{{Name: "cu13", CUDA: "13.0", Archs: "9.0", Layers: layers}}); err != nil {
		panic(err)
	}
	set, err := (&gimages.Resolver{}).Resolve(ctx, reg.Host+"/real:1.0")
	if err != nil {
		panic(err)
	}
	os.WriteFile("/tmp/xexp.env", []byte(fmt.Sprintf("A=%s\nR=%s\nREF=%s/real:1.0\nCHILD=%s\nRUNC=%s\nPID=%d\n", d.Address, reg.Host, reg.Host, set.Variants[0].Ref, d.RuncRoot, 0)), 0o644)
	fmt.Println("ready")
	<-ctx.Done()
}
