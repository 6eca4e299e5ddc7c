//go:build cgo && !nonvml

package node

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML reads facts through the NVIDIA management library.
type NVML struct {
	// Lib is the NVML binding; nil means the real libnvidia-ml.so.1.
	Lib nvml.Interface
}

// NewReader returns the reader of the real node.
func NewReader() Reader { return NVML{} }

// BuiltWithNVML tells whether this binary can read NVML.
const BuiltWithNVML = true

// Read asks NVML. A node without a driver is not an error: it gets facts
// marked unsupported, so callers can report it instead of crashing.
func (n NVML) Read(ctx context.Context) (*Facts, error) {
	lib := n.Lib
	if lib == nil {
		lib = nvml.New()
	}
	f := &Facts{Platform: HostPlatform(), GPUs: []GPU{}}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		switch ret {
		case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
			f.Unsupported = fmt.Sprintf("no NVIDIA driver (NVML init: %s)", nvmlErr(lib, ret))
		default:
			// A driver may be there but unusable (permissions, version
			// mismatch after an upgrade without reboot): say that, not "no driver".
			f.Unsupported = fmt.Sprintf("NVIDIA driver unusable (NVML init: %s)", nvmlErr(lib, ret))
		}
		return f, nil
	}
	defer lib.Shutdown()

	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml driver version: %s", nvmlErr(lib, ret))
	}
	f.Driver = driver
	cuda, ret := lib.SystemGetCudaDriverVersion_v2()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml CUDA driver version: %s", nvmlErr(lib, ret))
	}
	f.CUDA = CUDAFromDriverAPI(cuda)

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", nvmlErr(lib, ret))
	}
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		g, err := readDevice(lib, i)
		if err != nil {
			return nil, err
		}
		f.GPUs = append(f.GPUs, g)
	}
	if count == 0 {
		f.Unsupported = fmt.Sprintf("driver %s is loaded but reports no GPUs", driver)
	}
	return f, nil
}

func readDevice(lib nvml.Interface, i int) (GPU, error) {
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return GPU{}, fmt.Errorf("nvml device %d: %s", i, nvmlErr(lib, ret))
	}
	g := GPU{Index: i}
	var err error
	get := func(what string, r nvml.Return) {
		if r != nvml.SUCCESS && err == nil {
			err = fmt.Errorf("nvml device %d %s: %s", i, what, nvmlErr(lib, r))
		}
	}
	g.UUID, ret = d.GetUUID()
	get("uuid", ret)
	g.Name, ret = d.GetName()
	get("name", ret)
	major, minor, ret := d.GetCudaComputeCapability()
	get("compute capability", ret)
	g.CC = fmt.Sprintf("%d.%d", major, minor)
	if err != nil {
		return GPU{}, err
	}
	// Brand, memory and MIG are informative; old drivers or vGPUs may lack them.
	if b, ret := d.GetBrand(); ret == nvml.SUCCESS {
		g.Brand = BrandName(int(b))
	}
	if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryMiB = m.Total / (1 << 20)
	}
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
		if cur == nvml.DEVICE_MIG_ENABLE {
			g.MIG = "enabled"
		} else {
			g.MIG = "disabled"
		}
	}
	return g, nil
}

// nvmlErr names a return code. It uses Return.Error, which works with or
// without the library loaded, rather than lib.ErrorString: other Interface
// implementations (mocks, partial wrappers) may not implement it.
func nvmlErr(_ nvml.Interface, r nvml.Return) string {
	return fmt.Sprintf("%s (%d)", r.Error(), int32(r))
}
