package provision

import (
	"maps"
	"sync"

	"github.com/gpupin/gpupin/images"
)

// OverrideSource gives the operator's override of an engine, for wants
// that name none of their own.
type OverrideSource interface {
	Override(engine string) (images.Override, bool, error)
}

// OverridesFromFile reads the overrides file (images.OverrideFile) at path
// on every call, so an edit counts at the next provision. A missing file
// is no overrides; a malformed one is an error, never a silent auto.
func OverridesFromFile(path string) OverrideSource { return overrideFile(path) }

type overrideFile string

func (f overrideFile) Override(engine string) (images.Override, bool, error) {
	of, err := images.LoadOverrides(string(f))
	if err != nil {
		return images.Override{}, false, err
	}
	o, ok := of.Get(engine)
	return o, ok, nil
}

// Overrides is an OverrideSource held in memory: the agent's, which a
// watcher of the overrides file and its API keep up to date.
type Overrides struct {
	mu sync.Mutex
	m  map[string]images.Override
}

// NewOverrides makes an empty set: every engine auto.
func NewOverrides() *Overrides { return &Overrides{m: map[string]images.Override{}} }

// Override implements OverrideSource.
func (o *Overrides) Override(engine string) (images.Override, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[engine]
	return v, ok, nil
}

// Replace sets every override at once; on an error nothing changes.
func (o *Overrides) Replace(m map[string]string) error {
	norm, err := images.ParseOverrides(m)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.m = norm
	o.mu.Unlock()
	return nil
}

// Map returns the overrides as written.
func (o *Overrides) Map() map[string]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]string, len(o.m))
	for k, v := range maps.All(o.m) {
		out[k] = v.String()
	}
	return out
}

// noOverrides is the source of a provisioner told to read none.
type noOverrides struct{}

func (noOverrides) Override(string) (images.Override, bool, error) {
	return images.Override{}, false, nil
}

// NoOverrides is a source with no overrides: every engine auto.
func NoOverrides() OverrideSource { return noOverrides{} }
