package images

import (
	"fmt"
	"strings"

	yaml3 "go.yaml.in/yaml/v3"
)

// yamlBoolWords are the plain scalars YAML 1.1 reads as booleans. The
// overrides file is read by a YAML 1.1 decoder (sigs.k8s.io/yaml), so
// `vllm: off` arrives as the string "false"; YAML 1.2 (yaml.v3) reads only
// true and false so. Neither is ever meant as a variant name: an operator
// who writes `off` or `false` means "do not run it", which is none.
var yamlBoolWords = map[string]bool{
	"y": true, "yes": true, "n": true, "no": true,
	"true": true, "false": true, "on": true, "off": true,
}

// isYAMLBoolWord reports whether s, however cased, is one of them.
func isYAMLBoolWord(s string) bool { return yamlBoolWords[strings.ToLower(strings.TrimSpace(s))] }

// boolOverrideHint says what to write instead, in the file's words.
const boolOverrideHint = "write none to keep the engine off this node, or auto to let gpupin choose by driver and GPUs"

// CheckOverrideBooleans refuses YAML booleans among the values of the
// top-level `overrides:` mapping of a YAML document (the overrides file, the
// agent's config), naming the value as it was written and its line. A
// document that does not parse, or has no such mapping, is left to the
// caller's decoder to judge.
func CheckOverrideBooleans(data []byte) error {
	var doc yaml3.Node
	if err := yaml3.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml3.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "overrides" || top.Content[i+1].Kind != yaml3.MappingNode {
			continue
		}
		ovs := top.Content[i+1]
		for j := 0; j+1 < len(ovs.Content); j += 2 {
			k, v := ovs.Content[j], ovs.Content[j+1]
			if v.Kind != yaml3.ScalarNode {
				continue
			}
			// yaml.v3 resolves true/false (any case) to !!bool; the YAML 1.1
			// words (on, off, yes, no, y, n) it keeps as strings, so they are
			// checked by name, unless quoted (ParseOverride still refuses
			// them, quoted or not).
			plain := v.Style&(yaml3.SingleQuotedStyle|yaml3.DoubleQuotedStyle) == 0
			if v.Tag == "!!bool" || (plain && isYAMLBoolWord(v.Value)) {
				return fmt.Errorf("line %d: engine %s: %s is a YAML boolean (true/false), not an override; %s", v.Line, k.Value, v.Value, boolOverrideHint)
			}
		}
	}
	return nil
}
