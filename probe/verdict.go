package probe

// LinePrefix starts the one line of output a probe reports its verdict on.
const LinePrefix = "GPUPIN-PROBE "

// Verdict is the JSON after LinePrefix.
type Verdict struct {
	OK      bool           `json:"ok"`
	Devices []Device       `json:"devices"`
	Runtime map[string]any `json:"runtime,omitempty"`
	Detail  string         `json:"detail,omitempty"`
	// SimulatedChecks names the checks a probe could not make because the
	// node is simulated (no GPU, no driver): what a real run would have
	// proved and this one did not. Empty on a GPU node; gpupin refuses a
	// verdict there that lists any.
	SimulatedChecks []string `json:"simulated_checks,omitempty"`
	// Simulated is set by gpupin (never trusted from the probe's own line)
	// when the verdict came from a simulated probe on a node without a GPU.
	Simulated bool `json:"simulated,omitempty"`
}

// Device is one GPU's result.
type Device struct {
	Index     int     `json:"index"`
	UUID      string  `json:"uuid"`
	Name      string  `json:"name"`
	CC        string  `json:"cc"`
	TFLOPS    float64 `json:"tflops"`
	MaxAbsErr float64 `json:"max_abs_err"`
	OK        *bool   `json:"ok,omitempty"`
	Detail    string  `json:"detail,omitempty"`
}
