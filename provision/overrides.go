package provision

import (
	"fmt"
	"maps"
	"sync"

	"github.com/gpupin/gpupin/images"
)

// OverrideSource gives the operator's override of an engine, for wants
// that name none of their own. Setting and listing them (a Loop's
// SetOverrides and Overrides) are part of it, said in full so that a
// wrapper that lacks them does not compile: a source held elsewhere (a
// file, the cluster) refuses Replace and lists none, as NotSettable does.
type OverrideSource interface {
	Override(engine string) (images.Override, bool, error)
	// Replace sets every override at once; on an error nothing changes.
	Replace(m map[string]string) error
	// Map returns the overrides the source holds, as written.
	Map() map[string]string
}

// NotSettable is the Replace and Map of a source whose overrides are held
// elsewhere (the file `gpupin override` writes, the cluster's): Replace
// refuses, naming the source, and Map lists none. Embed it, with Source
// set to say where they are held.
type NotSettable struct{ Source string }

// Replace refuses: the overrides are set where they are held.
func (n NotSettable) Replace(map[string]string) error {
	return fmt.Errorf("the provisioner reads overrides from %s; the loop sets them only in a *provision.Overrides (provision.NewOverrides())", n.Source)
}

// Map lists none: the source holds no overrides in memory.
func (NotSettable) Map() map[string]string { return map[string]string{} }

// OverridesFromFile reads the overrides file (images.OverrideFile) at path
// on every call, so an edit counts at the next provision. A missing file
// is no overrides; a malformed one is an error, never a silent auto.
func OverridesFromFile(path string) OverrideSource {
	return overrideFile{path: path, NotSettable: NotSettable{Source: "the file " + path}}
}

type overrideFile struct {
	path string
	NotSettable
}

func (f overrideFile) Override(engine string) (images.Override, bool, error) {
	of, err := images.LoadOverrides(f.path)
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

func (noOverrides) Replace(map[string]string) error {
	return NotSettable{Source: "NoOverrides()"}.Replace(nil)
}
func (noOverrides) Map() map[string]string { return map[string]string{} }

func (noOverrides) Override(string) (images.Override, bool, error) {
	return images.Override{}, false, nil
}

// NoOverrides is a source with no overrides: every engine auto.
func NoOverrides() OverrideSource { return noOverrides{} }
