package images

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// overrideShapeError says what is wrong with an overrides file that does
// not read as `overrides: {ENGINE: VALUE}`, in the words of the YAML the
// operator wrote (a mapping, a list, a string), not in those of the JSON
// decoder the YAML goes through ("error unmarshaling JSON: … Go struct
// field …").
func overrideShapeError(path string, data []byte, err error) error {
	const want = "want a mapping whose one key, overrides, maps each engine to its override " +
		"(an `overrides:` line, then an indented `ENGINE: VALUE` line per engine; or overrides: {vllm: cu129, sglang: none})"
	j, yerr := yaml.YAMLToJSON(data)
	if yerr != nil {
		msg := strings.TrimPrefix(yerr.Error(), "error converting YAML to JSON: ")
		return fmt.Errorf("parse overrides %s: not YAML: %s; %s", path, msg, want)
	}
	var doc any
	if err := json.Unmarshal(j, &doc); err != nil {
		return fmt.Errorf("parse overrides %s: %s; %s", path, yamlWords(err.Error()), want)
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("parse overrides %s: the file is %s; %s", path, yamlKind(doc), want)
	}
	var unknown []string
	for k := range top {
		if k != "overrides" {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("parse overrides %s: unknown key %s at the top of the file (misspelt?); %s", path, strings.Join(unknown, ", "), want)
	}
	ovs, ok := top["overrides"].(map[string]any)
	if !ok && top["overrides"] != nil {
		return fmt.Errorf("parse overrides %s: overrides is %s; %s", path, yamlKind(top["overrides"]), want)
	}
	engines := make([]string, 0, len(ovs))
	for e := range ovs {
		engines = append(engines, e)
	}
	sort.Strings(engines)
	for _, e := range engines {
		switch ovs[e].(type) {
		case map[string]any, []any:
			return fmt.Errorf("parse overrides %s: engine %s: its override is %s; want one value: auto, none, a variant name (cu129) or an image reference", path, e, yamlKind(ovs[e]))
		}
	}
	return fmt.Errorf("parse overrides %s: %s; %s", path, yamlWords(err.Error()), want)
}

// yamlKind names a decoded YAML node as YAML does.
func yamlKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "a mapping (KEY: VALUE lines)"
	case []any:
		return "a list (- ITEM lines, or [A, B])"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "true/false"
	case nil:
		return "empty"
	}
	return fmt.Sprintf("a %T", v)
}

// yamlWords strips the JSON decoder's framing from a message.
func yamlWords(s string) string {
	for _, p := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "json: ", "yaml: "} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}
