package images

import (
	"fmt"
	"maps"
	"slices"
)

// Refusal is an engine name or override refused as input, not a file
// that could not be read or written: the CLI's usage error, the agent
// API's 400.
type Refusal struct{ Err error }

func (r *Refusal) Error() string { return r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

// ParseOverrides reads engine → override as a file, the agent's config or
// the cluster gives them, every name and value checked as one override is:
// the first refused (by engine name, so the same input says the same) is
// a *Refusal.
func ParseOverrides(m map[string]string) (map[string]Override, error) {
	out := make(map[string]Override, len(m))
	for _, engine := range slices.Sorted(maps.Keys(m)) {
		if err := CheckEngine(engine); err != nil {
			return nil, &Refusal{err}
		}
		o, err := ParseOverride(m[engine])
		if err != nil {
			return nil, &Refusal{fmt.Errorf("engine %s: %w", engine, err)}
		}
		out[engine] = o
	}
	return out, nil
}

// SetOverride records engine's override in the overrides file at path,
// under its lock (UpdateOverrides): the one way the CLI and the agent set
// one. A bad name or value is a *Refusal, and the file is left as it was.
func SetOverride(path, engine, value string) (Override, *OverrideFile, error) {
	parsed, err := ParseOverrides(map[string]string{engine: value})
	if err != nil {
		return Override{}, nil, err
	}
	o := parsed[engine]
	of, err := UpdateOverrides(path, func(of *OverrideFile) error {
		_, err := of.Set(engine, o.String())
		return err
	})
	if err != nil {
		return Override{}, nil, err
	}
	return o, of, nil
}
