package agent

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/gpupin/gpupin/provision"
)

// node-feature-discovery's local feature source: nfd-worker reads every
// file in its features.d directory (files whose name starts with '.' are
// skipped), a `name[=value]` per line, '#' for comments, 64 KiB at most,
// and labels the node with each line whose name carries a namespace
// (`gpupin.io/…`). gpupin writes one such file, so pods can ask for a node
// with node affinity on gpupin.io/ENGINE-VERSION, and gpupin needs no
// Kubernetes credentials: NFD, which has them, publishes the labels.

// DefaultNFDFeaturesDir is where nfd-worker reads local feature files.
const DefaultNFDFeaturesDir = "/etc/kubernetes/node-feature-discovery/features.d"

// NFDFileName is the file gpupin writes there.
const NFDFileName = "gpupin"

// NFDLabelPrefix is the namespace of gpupin's node labels.
const NFDLabelPrefix = "gpupin.io/"

// Kubernetes' rules for the name part of a label key and for a label
// value: at most 63 characters, alphanumeric at both ends, '-', '_' and
// '.' between (a value may be empty).
var (
	labelPartRE   = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	notLabelChars = regexp.MustCompile(`[^-A-Za-z0-9_.]+`)
)

const maxLabelPart = 63

// maxFeatureFile is the largest feature file nfd-worker reads; a larger
// one is ignored whole.
const maxFeatureFile = 64 << 10

// ValidLabelName reports whether s is a valid name part of a label key.
func ValidLabelName(s string) bool { return len(s) <= maxLabelPart && labelPartRE.MatchString(s) }

// ValidLabelValue reports whether s is a valid label value.
func ValidLabelValue(s string) bool { return s == "" || ValidLabelName(s) }

// labelSafe returns s when it is a valid label part as it stands, else
// a valid one made from it with a short hash of seed, so that two inputs
// the mapping changes never meet, nor meet one it keeps.
func labelSafe(s, seed string) string {
	if ValidLabelName(s) {
		return s
	}
	sum := sha256.Sum256([]byte(seed))
	h := hex.EncodeToString(sum[:4])
	t := strings.Trim(notLabelChars.ReplaceAllString(s, "_"), "-_.")
	if len(t) > maxLabelPart-len(h)-1 {
		t = strings.TrimRight(t[:maxLabelPart-len(h)-1], "-_.")
	}
	if t == "" {
		return h
	}
	return t + "-" + h
}

// FeatureLabel is the node label of an engine proved on the node: name
// gpupin.io/ENGINE-VERSION (a semantic version's '+', a key named by a
// digest, or a name over 63 characters is made label-safe, with a hash of
// the key), value the variant that was proved.
func FeatureLabel(engine, version, variant string) (name, value string) {
	key := engine + ":" + version
	return NFDLabelPrefix + labelSafe(engine+"-"+version, key), labelSafe(variant, key+"="+variant)
}

// featureLine is one engine's line, and what it is kept for.
type featureLine struct {
	key, ref    string
	name, value string
}

// FeatureFile keeps NFD's local feature file for the agent: one line per
// ready engine. It is rewritten only when its text changes, and always
// whole and atomically (a dot-file beside it, renamed over it), so
// nfd-worker never reads half a file.
type FeatureFile struct {
	Path string

	mu   sync.Mutex
	last []byte
	// before is the file as the agent found it at start: an engine not yet
	// looked at in this run (pending) keeps its line, so a restart does
	// not take every label off the node for the seconds its first pass takes.
	before []featureLine
}

// NewFeatureFile is the feature file in dir (DefaultNFDFeaturesDir when
// empty), reading what an earlier run left there.
func NewFeatureFile(dir string) (*FeatureFile, error) {
	if dir == "" {
		dir = DefaultNFDFeaturesDir
	}
	f := &FeatureFile{Path: filepath.Join(dir, NFDFileName)}
	data, err := os.ReadFile(f.Path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read the NFD feature file: %w", err)
	}
	f.before = parseFeatureFile(data)
	return f, nil
}

// parseFeatureFile reads back the lines this file writes: a comment that
// names the engine's key and reference, then its label.
func parseFeatureFile(data []byte) []featureLine {
	var out []featureLine
	var cur *featureLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "# engine "); ok {
			key, ref, _ := strings.Cut(rest, " from ")
			cur = &featureLine{key: key, ref: ref}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") || cur == nil {
			continue
		}
		cur.name, cur.value, _ = strings.Cut(line, "=")
		out = append(out, *cur)
		cur = nil
	}
	return out
}

// Lines is what the file holds for these statuses: a line per ready
// engine, and a pending engine's line from before; sorted, so the text
// changes only when a label does. Two engines whose labels would meet
// (engine "a-b" version "c", engine "a" version "b-c") both get a hash.
func (f *FeatureFile) Lines(sts []provision.Status) []featureLine {
	var out []featureLine
	for _, st := range sts {
		switch st.State {
		case provision.Ready:
			if st.Engine == "" || st.Version == "" || st.Variant == "" {
				continue
			}
			name, value := FeatureLabel(st.Engine, st.Version, st.Variant)
			out = append(out, featureLine{key: st.Engine + ":" + st.Version, ref: st.Ref, name: name, value: value})
		case provision.Pending:
			for _, b := range f.before {
				if b.key == st.Key || (b.ref != "" && b.ref == st.Ref) {
					out = append(out, b)
					break
				}
			}
		}
	}
	count := map[string]int{}
	for _, l := range out {
		count[l.name]++
	}
	for i, l := range out {
		if count[l.name] > 1 {
			engine, version, _ := strings.Cut(l.key, ":")
			out[i].name = NFDLabelPrefix + labelSafe(engine+"-"+version+"-"+hashOf(l.key), l.key)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}

// render is the file's text.
func render(lines []featureLine) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by the gpupin agent; do not edit. One label per engine proved and pinned on this node:\n")
	b.WriteString("# gpupin.io/ENGINE-VERSION=VARIANT. Pods start from gpupin.local/ENGINE:VERSION (imagePullPolicy: Never).\n")
	for _, l := range lines {
		fmt.Fprintf(&b, "# engine %s", l.key)
		if l.ref != "" {
			fmt.Fprintf(&b, " from %s", l.ref)
		}
		fmt.Fprintf(&b, "\n%s=%s\n", l.name, l.value)
	}
	return b.Bytes()
}

// Sync writes the file for these statuses if its text changed (or the
// file went). It reports whether it wrote.
func (f *FeatureFile) Sync(sts []provision.Status) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	text := render(f.Lines(sts))
	if len(text) > maxFeatureFile {
		return false, fmt.Errorf("NFD feature file %s: %d bytes, over the %d nfd-worker reads", f.Path, len(text), maxFeatureFile)
	}
	if bytes.Equal(text, f.last) {
		if cur, err := os.ReadFile(f.Path); err == nil && bytes.Equal(cur, text) {
			return false, nil
		}
	}
	if err := writeAtomic(f.Path, text); err != nil {
		return false, err
	}
	f.last = text
	return true, nil
}

// writeAtomic writes data to path through a dot-file in the same
// directory (nfd-worker skips dot-files), synced, then renamed over path.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("NFD feature file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("NFD feature file: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if err := errors.Join(err, tmp.Close()); err != nil {
		return fmt.Errorf("NFD feature file %s: %w", path, err)
	}
	// Readable by nfd-worker, which need not run as root.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("NFD feature file %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("NFD feature file %s: %w", path, err)
	}
	return nil
}
