// Package torch embeds the torch probe script, which gpupin stages on the host
// and bind-mounts into Python + PyTorch images.
package torch

import _ "embed"

// ScriptName is the script's file name, on the host and in the container.
const ScriptName = "gpupin_probe.py"

// Script is the torch probe (gpupin_probe.py).
//
//go:embed gpupin_probe.py
var Script []byte
