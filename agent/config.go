package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/gpupin/gpupin/images"
	"github.com/gpupin/gpupin/provision"
)

// DefaultConfigPath is where `gpupin agent` reads its wants.
const DefaultConfigPath = "/etc/gpupin/agent.yaml"

// Config is the agent's file:
//
//	wants:
//	  - engine: vllm          # optional: else from the image's metadata
//	    version: 0.11.0       # optional
//	    ref: registry.example/org/vllm:0.11.0
//	    override: cu129       # optional: auto, none, a variant or an image
//	overrides:                # per engine, for wants that name none
//	  sglang: none
type Config struct {
	Wants     []provision.Want  `json:"wants"`
	Overrides map[string]string `json:"overrides,omitempty"`
}

// LoadConfig reads and checks the agent's file. A missing file is an empty
// config: the agent then waits for wants through its API.
func LoadConfig(path string) (*Config, []byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Config{}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read agent config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, nil, fmt.Errorf("agent config %s: %w", path, err)
	}
	return cfg, data, nil
}

// ParseConfig reads the agent's file from bytes, strictly: a misspelt key
// would otherwise silently mean no wants.
func ParseConfig(data []byte) (*Config, error) {
	var cfg Config
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return nil, fmt.Errorf("parse: %w (want `wants: [{ref: …}]` and `overrides: {ENGINE: VALUE}`)", err)
	}
	// On the text: the decoder has already turned `vllm: off` into "false".
	if err := images.CheckOverrideBooleans(data); err != nil {
		return nil, fmt.Errorf("overrides: %w", err)
	}
	if err := CheckWants(cfg.Wants); err != nil {
		return nil, err
	}
	if _, err := images.ParseOverrides(cfg.Overrides); err != nil {
		return nil, fmt.Errorf("overrides: %w", err)
	}
	return &cfg, nil
}

// CheckWants checks wants as provision.Loop.SetWants would.
func CheckWants(wants []provision.Want) error {
	seen := map[string]bool{}
	for i, w := range wants {
		if err := provision.ValidateWant(w); err != nil {
			return fmt.Errorf("want %d: %w", i+1, err)
		}
		if seen[w.Key()] {
			return fmt.Errorf("want %d: %s is wanted twice", i+1, w.Key())
		}
		seen[w.Key()] = true
	}
	return nil
}
