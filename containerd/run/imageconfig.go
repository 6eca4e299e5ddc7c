package run

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ImageConfig returns the config of an image record for the platform.
func (r *Runner) ImageConfig(ctx context.Context, name, platform string) (ocispec.ImageConfig, error) {
	ctx = r.conn.Ctx(ctx)
	rec, err := r.conn.Client.ImageService().Get(ctx, name)
	if err != nil {
		return ocispec.ImageConfig{}, fmt.Errorf("image %s: %w", name, err)
	}
	matcher := platforms.Default()
	if platform != "" {
		if p, err := platforms.Parse(platform); err == nil {
			matcher = platforms.Only(p)
		}
	}
	spec, err := client.NewImageWithPlatform(r.conn.Client, rec, matcher).Spec(ctx)
	if err != nil {
		return ocispec.ImageConfig{}, fmt.Errorf("config of %s: %w", name, err)
	}
	return spec.Config, nil
}
