package pull

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/containerd/v2/pkg/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Where a blob came from.
//
// containerd's pull labels each blob it stores
// containerd.io/distribution.source.<host>=<repo>[,<repo>…], and a
// peer-to-peer mirror that serves blobs from a node's content store
// (Spegel) advertises only blobs so labelled, reading the labels when the
// content-create event arrives: a label added after the commit is not
// seen. gpupin stores blobs itself (its layers never pass containerd's
// labelling step), so it labels each at its commit, with the reference
// it was asked for, not the staging name nor a mirror's host.

// source is the distribution-source label of one pull.
type source struct {
	ref        string // the upstream reference
	key, value string // "" when the reference makes no valid label
}

func newSource(ref string) source {
	s := source{ref: ref}
	spec, err := reference.Parse(ref)
	if err != nil {
		return s
	}
	// As docker.AppendDistributionSourceLabel names it (host without its
	// port, repository path).
	u, err := url.Parse("dummy://" + spec.Locator)
	if err != nil {
		return s
	}
	key, value := labels.LabelDistributionSource+"."+u.Hostname(), strings.TrimPrefix(u.Path, "/")
	if labels.Validate(key, value) != nil {
		return s
	}
	s.key, s.value = key, value
	return s
}

// commitOpts label a blob committed now.
func (s source) commitOpts() []content.Opt {
	if s.key == "" {
		return nil
	}
	return []content.Opt{content.WithLabels(map[string]string{s.key: s.value})}
}

// addTo labels a blob the store already has, keeping the repositories its
// label names, as containerd's pull does.
func (s source) addTo(ctx context.Context, cs content.Store, desc ocispec.Descriptor) error {
	if s.key == "" {
		return nil
	}
	h, err := docker.AppendDistributionSourceLabel(cs, s.ref)
	if err != nil {
		return fmt.Errorf("label %s with its source: %w", desc.Digest, err)
	}
	if _, err := h(ctx, desc); err != nil {
		return fmt.Errorf("label %s with its source: %w", desc.Digest, err)
	}
	return nil
}

// labelled stores every blob the pull dispatches (manifests, configs, and
// under containerd's unpacker its layers) labelled at commit, before h,
// whose fetch then finds it stored.
func (u *unpacker) labelled(h images.Handler) images.Handler {
	return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if images.IsLayerType(desc.MediaType) {
			// containerd's own unpack: its layers come through here.
			if err := u.awaitLayer(ctx, desc); err != nil {
				return nil, err
			}
		}
		fetcher, err := u.resolver.Fetcher(ctx, u.name)
		if err != nil {
			return nil, fmt.Errorf("fetcher: %w", err)
		}
		if err := u.fetch(ctx, u.content, fetcher, desc, nil); err != nil {
			slog.DebugContext(ctx, "store with its source label", "digest", desc.Digest, "err", err)
			return nil, err
		}
		return h.Handle(ctx, desc)
	})
}
