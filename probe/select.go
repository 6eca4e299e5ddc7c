package probe

import (
	"fmt"
	"strings"
)

const (
	// Annotation names the probe an image wants (torch, cuda or exec).
	Annotation = "io.gpupin.probe"
	// ExecLabel holds the JSON argv of an image's own self-test, for the exec probe.
	ExecLabel = "io.gpupin.probe.exec"
)

// imageKinds are the probes an image may ask for. Sim is not among them: an
// image must not be able to swap a real GPU proof for a simulated one.
var imageKinds = []Kind{Torch, CUDA, Exec}

// engineKinds maps engines to their default probe; engines not listed get CUDA.
var engineKinds = map[string]Kind{
	"vllm":   Torch,
	"sglang": Torch,
}

// Select picks the probe for an image: its io.gpupin.probe annotation wins,
// else the engine family's default (vllm, sglang → torch), else fallback
// (the operator's --probe flag), else cuda, which runs in any glibc image. The fallback may also be sim, since it is the operator's choice.
func Select(annotation, engine, fallback string) (Kind, error) {
	if a := strings.TrimSpace(annotation); a != "" {
		k, err := lookupKind(a, imageKinds)
		if err != nil {
			return "", fmt.Errorf("%s annotation: %w", Annotation, err)
		}
		return k, nil
	}
	if k, ok := engineKinds[EngineFamily(engine)]; ok {
		return k, nil
	}
	if f := strings.TrimSpace(fallback); f != "" {
		k, err := ParseDefault(f)
		if err != nil {
			return "", fmt.Errorf("default probe: %w", err)
		}
		return k, nil
	}
	return CUDA, nil
}

// ParseDefault checks an operator's default probe (--probe): an image's
// kinds or sim. Callers check it where it is given, before any image is
// read, since Select sees it only for engines without a default of their
// own.
func ParseDefault(name string) (Kind, error) {
	return lookupKind(strings.TrimSpace(name), append(imageKinds[:len(imageKinds):len(imageKinds)], Sim))
}

func lookupKind(name string, accepted []Kind) (Kind, error) {
	names := make([]string, len(accepted))
	for i, k := range accepted {
		if strings.EqualFold(name, string(k)) {
			return k, nil
		}
		names[i] = string(k)
	}
	return "", fmt.Errorf("unknown probe %q (accepted: %s)", name, strings.Join(names, ", "))
}
