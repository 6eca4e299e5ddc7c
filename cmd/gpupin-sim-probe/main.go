// Command gpupin-sim-probe is the sim probe: on a simulated node (no GPU),
// it emulates the verdict a GPU probe would give, for test images and demos
// that set GPUPIN_SIM_PROBE. gpupin bind-mounts it read-only into the
// image; it is a static binary (CGO_ENABLED=0, standard library only), so
// it runs in any image, scratch and distroless ones too, which have no shell.
//
// It first prints one "GPUPIN-SIM key=value" line per fact about its
// container (network interfaces, root filesystem, capabilities…), which
// integration tests use to check the probe box; then, by GPUPIN_SIM_PROBE,
// a verdict line (docs/probe-protocol.md has the table).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpupin/gpupin/probe"
)

// hangChild marks the child that hang mode starts.
const hangChild = "GPUPIN_SIM_HANG_CHILD"

func main() {
	if os.Getenv(hangChild) == "1" {
		sleepForever()
	}
	os.Exit(run(os.Stdout, os.Getenv))
}

// sleepForever never returns; a goroutine-free select{} would be reported
// as a deadlock by the runtime.
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

// run prints the diagnostics and the verdict and returns the exit code.
func run(w io.Writer, getenv func(string) string) int {
	diagnostics(w, getenv)
	var devices []probe.Device
	if js := getenv(probe.EnvSimDevices); js != "" {
		if err := json.Unmarshal([]byte(js), &devices); err != nil {
			return verdict(w, false, nil, "simulated failure: "+probe.EnvSimDevices+" is not a JSON array of devices: "+err.Error(), nil)
		}
	}
	switch mode := getenv(probe.EnvSimProbe); mode {
	case "", "emulate":
	case "fail":
		return verdict(w, false, devices, "simulated failure: GPUPIN_SIM_PROBE=fail", nil)
	case "hang":
		// A stuck probe with a child process, as a shell and its sleep (or
		// an engine and its workers) would be: the timeout must kill both.
		// The child is this binary again: the image may have nothing else.
		if exe, err := os.Executable(); err == nil {
			child := exec.Command(exe)
			child.Env = []string{hangChild + "=1"}
			child.Start()
		}
		sleepForever()
	case "garbled":
		fmt.Fprintln(w, `GPUPIN-PROBE {"ok":tru`)
		return 0
	case "noline":
		return 0
	case "exit1":
		verdict(w, true, devices, "simulated: valid verdict, exit code 1", nil)
		return 1
	case "big":
		line := strings.Repeat("0123456789abcdef", 64) + "\n" // 1 KiB, and the newline
		for i := 0; i < 1024; i++ {
			io.WriteString(w, line)
		}
	default:
		if strings.IndexFunc(mode, func(r rune) bool {
			return !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
		}) >= 0 {
			mode = "(unprintable)"
		}
		return verdict(w, false, devices, fmt.Sprintf("simulated failure: unknown GPUPIN_SIM_PROBE=%s (want %s)",
			mode, strings.Join(probe.SimModes, ", ")), nil)
	}
	if len(devices) == 0 {
		return verdict(w, false, nil, "simulated failure: no simulated devices ("+probe.EnvSimDevices+" is empty)", nil)
	}

	// What a GPU would say of this image: its CUDA runtime needs a driver
	// that supports at least that version.
	image, node := getenv("CUDA_VERSION"), getenv(probe.EnvSimNodeCUDA)
	extra := map[string]any{}
	if iv, ok := majorMinor(image); ok {
		extra["image_cuda"] = image
		if nv, ok := majorMinor(node); ok {
			extra["node_cuda"] = node
			if iv[0] > nv[0] || iv[0] == nv[0] && iv[1] > nv[1] {
				return verdict(w, false, devices, fmt.Sprintf("CUDA driver version is insufficient for CUDA runtime version (simulated: image CUDA %s, node supports %s)", image, node), extra)
			}
		}
	}
	return verdict(w, true, devices, "simulated", extra)
}

// verdict prints the verdict line and returns the exit code that goes with it.
func verdict(w io.Writer, ok bool, devices []probe.Device, detail string, extra map[string]any) int {
	if devices == nil {
		devices = []probe.Device{}
	}
	rt := map[string]any{"probe": "sim", "simulated": true}
	for k, v := range extra {
		rt[k] = v
	}
	v := probe.Verdict{OK: ok, Devices: devices, Runtime: rt, Detail: detail,
		SimulatedChecks: []string{"the image's own probe (emulated by gpupin-sim-probe, GPUPIN_SIM_PROBE)"}}
	js, err := json.Marshal(v)
	if err != nil {
		js = []byte(`{"ok":false,"devices":[],"detail":"cannot encode verdict"}`)
		ok = false
	}
	fmt.Fprintf(w, "%s%s\n", probe.LinePrefix, js)
	if !ok {
		return 1
	}
	return 0
}

// majorMinor reads "12", "12.9" or "12.9.1" as [12 9].
func majorMinor(s string) ([2]int, bool) {
	var mm [2]int
	parts := strings.Split(s, ".")
	if s == "" || len(parts) > 4 {
		return mm, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p == "" || p[0] == '+' {
			return mm, false
		}
		if i < 2 {
			mm[i] = n
		}
	}
	return mm, true
}

// diagnostics prints the container's own view of its box, one fact a line.
func diagnostics(w io.Writer, getenv func(string) string) {
	var net []string
	if entries, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range entries {
			net = append(net, e.Name())
		}
	}
	fmt.Fprintf(w, "GPUPIN-SIM net=%s\n", strings.Join(net, " "))

	writable := "no"
	if f, err := os.OpenFile("/.gpupin-rw-test", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err == nil {
		f.Close()
		os.Remove("/.gpupin-rw-test")
		writable = "yes"
	}
	fmt.Fprintf(w, "GPUPIN-SIM rootfs-writable=%s\n", writable)

	status := map[string]string{}
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					status[k] = f[0]
				}
			}
		}
	}
	for _, kv := range [][2]string{{"capeff", "CapEff"}, {"nonewprivs", "NoNewPrivs"}, {"uid", "Uid"}} {
		fmt.Fprintf(w, "GPUPIN-SIM %s=%s\n", kv[0], status[kv[1]])
	}
	fmt.Fprintf(w, "GPUPIN-SIM env=%s\n", getenv("GPUPIN_CDI_TEST"))
	devs, _ := filepath.Glob("/dev/gpupin-test*")
	fmt.Fprintf(w, "GPUPIN-SIM devices=%s\n", strings.Join(devs, " "))
}
