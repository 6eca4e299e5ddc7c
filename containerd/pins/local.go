package pins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"

	"github.com/gpupin/gpupin/containerd/conn"
	"github.com/gpupin/gpupin/registry"
)

// DefaultLocalPrefix is where a pin's node-local name lives unless
// WithLocalPrefix says otherwise: gpupin.local/ENGINE:VERSION. The .local
// domain is reserved for link-local names (RFC 6762), so no registry
// answers for it; but a peer-to-peer mirror (Spegel) that mirrors every
// registry serves its peers' records of it, so a pull of the name can
// succeed with another node's image. A pod with imagePullPolicy: Never
// that names it starts from this node's proof, or fails with
// ErrImageNeverPull on a node that has none; a record of the name that
// gpupin did not write here is foreign (foreignLocal), and Recover
// replaces or removes it.
const DefaultLocalPrefix = "gpupin.local"

// Labels of the node-local name records.
const (
	// LabelLocal is on a local-name record: the key (engine:version) of
	// the pin it stands for. gc and unpin find local names by it, whatever
	// prefix made them.
	LabelLocal = "io.gpupin.local"
	// LabelLocalPin is gpupin's marker on a local-name record it wrote:
	// the name of the pin record (REPO@sha256:…) the local name stands
	// for. It counts only while that record, in this namespace, is (or
	// was) the pin of the key and has the local record's target: it binds
	// the local name to a proof made on this node, so labels copied from
	// another node's record, or onto another image, do not make one.
	LabelLocalPin = "io.gpupin.local.pin"
	// LabelRestored is on a pin record Recover put back after another
	// client removed or relabelled it: when (RFC 3339).
	LabelRestored = "io.gpupin.restored"
)

// LocalPrefix is the prefix of the node-local names this store makes.
func (r *Store) LocalPrefix() string { return r.localPrefix }

// LocalName is the node-local name of the pin of key under this store's
// prefix.
func (r *Store) LocalName(key string) string {
	n, _ := LocalName(r.localPrefix, key)
	return n
}

// CheckLocalPrefix refuses a prefix that does not make a normalised
// reference: kubelet and CRI look images up by the normalised name, so
// "vllm" (which would become docker.io/library/…) cannot be one.
func CheckLocalPrefix(prefix string) error {
	probe := prefix + "/engine:version"
	n, err := reference.ParseNormalizedNamed(probe)
	if err != nil {
		return fmt.Errorf("local name prefix %q: %w", prefix, err)
	}
	if n.String() != probe {
		return fmt.Errorf("local name prefix %q: %s normalises to %s; give a registry host (with a dot, a port, or localhost), e.g. %s", prefix, probe, n, DefaultLocalPrefix)
	}
	return nil
}

var (
	// A repository path component and a tag, as the distribution
	// reference grammar has them.
	pathComponentRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)
	tagRE           = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	notTagCharRE    = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)
	notPathCharRE   = regexp.MustCompile(`[^a-z0-9]+`)
)

// LocalName is the node-local name of the pin of key (engine:version)
// under prefix: PREFIX/ENGINE:VERSION. An engine name or version that is
// no repository component or tag as it stands (a version with '+', as
// semantic versions have; a key named by a digest) is made one and gets
// a short hash of the key, so two keys never share a name:
// 0.11.0+cu129 becomes 0.11.0_cu129-1a2b3c4d.
func LocalName(prefix, key string) (string, error) {
	if prefix == "" {
		prefix = DefaultLocalPrefix
	}
	engine, version, ok := strings.Cut(key, ":")
	if !ok || engine == "" || version == "" {
		return "", fmt.Errorf("local name of %q: want engine:version", key)
	}
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:4])
	if !pathComponentRE.MatchString(engine) {
		engine = strings.Trim(notPathCharRE.ReplaceAllString(strings.ToLower(engine), "-"), "-")
		if len(engine) > 64 {
			engine = strings.TrimRight(engine[:64], "-")
		}
		if engine == "" {
			engine = "engine"
		}
		engine += "-" + h
	}
	if !tagRE.MatchString(version) {
		version = strings.TrimLeft(notTagCharRE.ReplaceAllString(version, "_"), ".-")
		if len(version) > 118 {
			version = version[:118]
		}
		if version == "" {
			version = "v"
		}
		version += "-" + h
	}
	name := prefix + "/" + engine + ":" + version
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", fmt.Errorf("local name of %s: %w", key, err)
	}
	if n.String() != name {
		return "", fmt.Errorf("local name of %s: %s normalises to %s", key, name, n)
	}
	return name, nil
}

// LocalNames is what a person should know of the node-local names here.
type LocalNames struct {
	Prefix string `json:"prefix"`
	// Mirror is the hosts configuration that counts for the prefix's
	// host: its own directory, or _default.
	Mirror registry.Mirrors `json:"mirror"`
	// Warning, when a mirror is named: what to add to its filters.
	Warning string `json:"warning,omitempty"`
}

// LocalNames says whether containerd's hosts configuration names a mirror
// for the local prefix's host. A peer-to-peer mirror configured for every
// registry (Spegel writes _default) serves and advertises each node's
// records of PREFIX/…: a pull of a local name (an IfNotPresent pod, an
// operator's crictl pull) then gets another node's image, one this node
// never proved. Recover replaces or removes such a record on its next
// pass; the mirror's filters keep it from happening.
func (r *Store) LocalNames(ctx context.Context) (LocalNames, error) {
	host, _, _ := strings.Cut(r.localPrefix, "/")
	m, err := r.conn.Registry.Mirrors(ctx, host)
	ln := LocalNames{Prefix: r.localPrefix, Mirror: m}
	if err != nil || !m.Mirrored() {
		return ln, err
	}
	re := "^" + regexp.QuoteMeta(r.localPrefix+"/")
	ln.Warning = fmt.Sprintf("%s names a mirror (%s) for %s, so a pull of a node-local name %s/ENGINE:VERSION can get another node's image, one this node never proved. "+
		"Add %s to the mirror's registry filters (Spegel: the chart's spegel.registryFilters, or --registry-filters), or list only the registries you use in its mirroredRegistries "+
		"so it writes no _default; keep imagePullPolicy: Never on pods that name %s/ (deploy/kubernetes/local-names-policy.yaml refuses the others). "+
		"gpupin replaces or removes a record of a local name it did not write on its next sweep",
		m.File, strings.Join(m.Hosts, ", "), host, r.localPrefix, re, r.localPrefix)
	return ln, nil
}

// localLabels are the labels of a local-name record of the pin cur.
func localLabels(key string, cur images.Image) map[string]string {
	return map[string]string{LabelLocal: key, LabelLocalPin: cur.Name, conn.LabelManaged: "true", conn.LabelCreated: "true",
		LabelCRIPinned: "pinned", LabelVariant: cur.Labels[LabelVariant]}
}

var localLabelKeys = []string{LabelLocal, LabelLocalPin, conn.LabelManaged, conn.LabelCreated, LabelCRIPinned, LabelVariant}

func sameLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// strayKey gathers the records under the prefix that are no key's local
// name: nothing gpupin writes has such a name, so they are removed.
const strayKey = ""

// localNameKey is the key whose local name (under this store's prefix)
// is name: one of the keys known, or the ENGINE:VERSION the name spells;
// strayKey when none.
func (r *Store) localNameKey(name string, known map[string]*keyState) string {
	for k := range known {
		if k != strayKey && r.LocalName(k) == name {
			return k
		}
	}
	rest := strings.TrimPrefix(name, r.localPrefix+"/")
	if i := strings.LastIndex(rest, ":"); i > 0 && !strings.Contains(rest, "@") {
		if k := rest[:i] + ":" + rest[i+1:]; r.LocalName(k) == name {
			return k
		}
	}
	return strayKey
}

// localNames maps each key to the local names that point at its pin,
// this store's own prefix first.
func (r *Store) localNames(ctx context.Context) (map[string][]images.Image, error) {
	imgs, err := r.conn.Client.ImageService().List(ctx, fmt.Sprintf(`labels.%q`, LabelLocal))
	if err != nil {
		return nil, fmt.Errorf("list local names: %w", err)
	}
	out := map[string][]images.Image{}
	for _, img := range imgs {
		k := img.Labels[LabelLocal]
		out[k] = append(out[k], img)
	}
	for k, v := range out {
		own := r.LocalName(k)
		sort.SliceStable(v, func(i, j int) bool { return v[i].Name == own && v[j].Name != own })
		out[k] = v
	}
	return out, nil
}

// keepLocal carries out steps (planKeepLocal) that point the key's local
// names at its pin, stopping at the first that fails.
func (r *Store) keepLocal(ctx context.Context, key string, steps []localStep) ([]Recovered, error) {
	var out []Recovered
	for _, st := range steps {
		done, err := r.applyLocal(ctx, st)
		if err != nil {
			return out, fmt.Errorf("pin %s: %w", key, err)
		}
		out = append(out, done)
	}
	return out, nil
}

// applyLocal carries out one local-name step and says what was done:
// st.done, unless the daemon's answer made it more.
func (r *Store) applyLocal(ctx context.Context, st localStep) (Recovered, error) {
	is := r.conn.Client.ImageService()
	l := st.rec
	switch st.op {
	case localMove, localReplace:
		paths := append([]string{"target"}, labelPaths(localLabelKeys)...)
		if st.op == localReplace {
			paths = []string{"target", "labels"}
		}
		if _, err := is.Update(ctx, l, paths...); err != nil {
			return st.done, fmt.Errorf("move the local name %s: %w", l.Name, err)
		}
	case localCreate:
		_, err := is.Create(ctx, l)
		if errdefs.IsAlreadyExists(err) {
			// A record of that name made since the key's records were read,
			// not by gpupin: the name is under gpupin's prefix, so it is
			// taken over.
			st.done = actForeign.report(st.done.Key, l.Name, l.Name+" appeared, not written by gpupin: replaced by this node's own, on "+l.Labels[LabelLocalPin])
			_, err = is.Update(ctx, l, "target", "labels")
		}
		if err != nil {
			return st.done, fmt.Errorf("make the local name %s: %w", l.Name, err)
		}
	case localDelete:
		if err := is.Delete(ctx, l.Name); err != nil && !errdefs.IsNotFound(err) {
			return st.done, fmt.Errorf("remove the local name %s: %w", l.Name, err)
		}
	case localUnlabel:
		l.Labels = nil
		if _, err := is.Update(ctx, l, labelPaths(localLabelKeys)...); err != nil && !errdefs.IsNotFound(err) {
			return st.done, fmt.Errorf("take gpupin's labels off %s: %w", l.Name, err)
		}
	default:
		return st.done, fmt.Errorf("local name %s: no such step (%s)", l.Name, st.op)
	}
	return st.done, nil
}

// removeStrays removes the records under the prefix that are no key's
// local name (a name gpupin never writes, pulled or made by hand).
func (r *Store) removeStrays(ctx context.Context, strays []images.Image) (out []Recovered, err error) {
	defer func() { r.reportForeign(out) }()
	var errs []error
	for _, l := range strays {
		if err := r.conn.Client.ImageService().Delete(ctx, l.Name); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove %s: %w", l.Name, err))
			continue
		}
		out = append(out, actForeign.report("", l.Name, fmt.Sprintf(
			"%s, on %s, is under gpupin's local prefix but is no local name gpupin writes (a pull of the name, or made by hand): removed", l.Name, l.Target.Digest)))
	}
	return out, errors.Join(errs...)
}
