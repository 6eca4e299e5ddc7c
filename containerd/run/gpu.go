package run

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// GPUMode is how GPUs reach a container.
type GPUMode string

const (
	// GPUCDI injects CDI devices: what `nvidia-ctk cdi generate` describes.
	GPUCDI GPUMode = "cdi"
	// GPUNvidiaRuntime runs the container under nvidia-container-runtime.
	GPUNvidiaRuntime GPUMode = "nvidia-runtime"
	// GPUNone gives the container no GPU (simulated nodes).
	GPUNone GPUMode = "none"
)

// GPUs says which GPUs a container gets and how.
type GPUs struct {
	Mode GPUMode
	// Devices are CDI names (nvidia.com/gpu=all, nvidia.com/gpu=0); for the
	// nvidia runtime, the values of NVIDIA_VISIBLE_DEVICES.
	Devices []string
}

// DefaultCDIDevice is every GPU, as nvidia-ctk names it.
const DefaultCDIDevice = "nvidia.com/gpu=all"

// ParseGPUs reads how GPUs reach a container (mode: cdi, the default,
// nvidia-runtime or none) and which (devices, each value a comma list).
// Under CDI "all" and bare indexes or UUIDs are NVIDIA's devices, fully
// qualified names pass as they are, and none given is every GPU; under the
// nvidia runtime they are NVIDIA_VISIBLE_DEVICES's values.
func ParseGPUs(mode string, devices []string) (GPUs, error) {
	switch g := (GPUs{Mode: GPUMode(cmp.Or(mode, string(GPUCDI)))}); g.Mode {
	case GPUCDI:
		g.Devices = cdiDevices(devices)
		return g, nil
	case GPUNvidiaRuntime:
		g.Devices = devices
		return g, nil
	case GPUNone:
		return g, nil
	}
	return GPUs{}, fmt.Errorf("gpu mode %q: want cdi, nvidia-runtime or none", mode)
}

func cdiDevices(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			switch {
			case s == "":
			case strings.Contains(s, "="):
				out = append(out, s)
			default:
				out = append(out, "nvidia.com/gpu="+s)
			}
		}
	}
	if len(out) == 0 {
		out = []string{DefaultCDIDevice}
	}
	return out
}

// withCDI injects CDI devices from the runner's spec directories. A node
// whose specs know no such device gets an error that says how to make them.
func (r *Runner) withCDI(devices []string) oci.SpecOpts {
	return func(ctx context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		cache, err := cdi.NewCache(cdi.WithSpecDirs(r.cdiDirs...), cdi.WithAutoRefresh(false))
		if err != nil {
			return fmt.Errorf("read CDI specs in %s: %w", strings.Join(r.cdiDirs, ", "), err)
		}
		known := cache.ListDevices()
		for _, d := range devices {
			if cache.GetDevice(d) == nil {
				var specErrs []string
				for path, errs := range cache.GetErrors() {
					for _, e := range errs {
						specErrs = append(specErrs, fmt.Sprintf("%s: %v", path, e))
					}
				}
				sort.Strings(specErrs)
				msg := fmt.Sprintf("CDI device %s is not described in %s (known: %s); on an NVIDIA node, generate the spec with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`",
					d, strings.Join(r.cdiDirs, ", "), listOrNone(known))
				if len(specErrs) > 0 {
					msg += "; spec errors: " + strings.Join(specErrs, "; ")
				}
				return fmt.Errorf("%s", msg)
			}
		}
		if _, err := cache.InjectDevices(s, devices...); err != nil {
			return fmt.Errorf("inject CDI devices %s: %w", strings.Join(devices, ","), err)
		}
		return nil
	}
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// DefaultGPUs is how GPUs reach a container when nothing else is asked:
// every GPU through CDI, and none on a simulated node, which has none to
// give.
func DefaultGPUs(simulated bool) GPUs {
	if simulated {
		return GPUs{Mode: GPUNone}
	}
	return GPUs{Mode: GPUCDI, Devices: []string{DefaultCDIDevice}}
}
