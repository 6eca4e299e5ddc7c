package images

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"
)

// DefaultOverridesPath is where the CLI keeps the node's overrides.
const DefaultOverridesPath = "/etc/gpupin/overrides.yaml"

// OverrideFile is the node's overrides, one per engine, as kept on disk:
//
//	overrides:
//	  vllm: cu129
//	  sglang: none
type OverrideFile struct {
	Path string
	// Overrides maps an engine to its override as written (ParseOverride reads it).
	Overrides map[string]string
}

type overrideDoc struct {
	Overrides map[string]string `json:"overrides"`
}

const overrideHeader = "# gpupin overrides, per engine: auto | none | a variant name (cu129) | an image reference.\n# Written by `gpupin override`; edits by hand are read too.\n"

// ValidEngineName reports whether s can name an engine: lower-case letters,
// digits, '.', '_' and '-', starting with a letter or digit, at most 64 bytes.
func ValidEngineName(s string) bool { return validEngine(s) }

// ErrEngineName is what CheckEngine's errors wrap.
var ErrEngineName = errors.New("is not an engine name (lower-case letters, digits, '.', '_', '-', from a letter or digit, at most 64 bytes)")

// CheckEngine refuses what cannot name an engine, in the one wording every
// input (wants, overrides, annotations, the API, the cluster) reports.
func CheckEngine(s string) error {
	if validEngine(s) {
		return nil
	}
	return fmt.Errorf("%q %w", s, ErrEngineName)
}

// LoadOverrides reads the overrides file. A missing file is no overrides:
// every engine is auto. Every entry is validated, so a bad hand edit is an
// error that names the file and the engine rather than a wrong choice later.
func LoadOverrides(path string) (*OverrideFile, error) {
	of := &OverrideFile{Path: path, Overrides: map[string]string{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return of, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read overrides: %w", err)
	}
	var doc overrideDoc
	// Strict: a misspelt top-level key would otherwise silently mean "no overrides".
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, overrideShapeError(path, data, err)
	}
	// Checked on the text: the decoder has already turned `off` into "false".
	if err := CheckOverrideBooleans(data); err != nil {
		return nil, fmt.Errorf("overrides %s: %w", path, err)
	}
	parsed, err := ParseOverrides(doc.Overrides)
	if refused := (*Refusal)(nil); errors.As(err, &refused) {
		// A bad file is the file's fault, not the caller's input.
		return nil, fmt.Errorf("overrides %s: %w", path, refused.Err)
	}
	for engine := range parsed {
		of.Overrides[engine] = strings.TrimSpace(doc.Overrides[engine])
	}
	return of, nil
}

// Get returns the engine's override; auto when none is set.
func (of *OverrideFile) Get(engine string) (Override, bool) {
	v, ok := of.Overrides[engine]
	if !ok {
		return Override{Kind: OverrideAuto}, false
	}
	o, err := ParseOverride(v)
	if err != nil {
		// Load and Set validate; a value that fails here was put in the map
		// by hand, and auto is the safe reading.
		return Override{Kind: OverrideAuto}, false
	}
	return o, true
}

// Engines lists the engines with an override, sorted.
func (of *OverrideFile) Engines() []string {
	out := make([]string, 0, len(of.Overrides))
	for e := range of.Overrides {
		out = append(out, e)
	}
	sort.Strings(out)
	return out
}

// Set validates and records an override in memory; Save writes it.
func (of *OverrideFile) Set(engine, value string) (Override, error) {
	parsed, err := ParseOverrides(map[string]string{engine: value})
	if err != nil {
		return Override{}, err
	}
	o := parsed[engine]
	if of.Overrides == nil {
		of.Overrides = map[string]string{}
	}
	of.Overrides[engine] = o.String()
	return o, nil
}

// Clear removes an engine's override in memory; it reports whether one was set.
func (of *OverrideFile) Clear(engine string) bool {
	_, ok := of.Overrides[engine]
	delete(of.Overrides, engine)
	return ok
}

// Save writes the file atomically: a temporary file in the same directory,
// fsynced, renamed over the old one, and the directory fsynced, so a crash
// leaves the old file or the new one, never half of one. The parent
// directory is created; an existing file keeps its mode, a new one is 0644.
func (of *OverrideFile) Save() error {
	body, err := yaml.Marshal(overrideDoc{Overrides: of.Overrides})
	if err != nil {
		return fmt.Errorf("encode overrides: %w", err)
	}
	return writeFileAtomic(of.Path, append([]byte(overrideHeader), body...), 0o644)
}

// maxLinks bounds a chain of symlinks, as the kernel's ELOOP does.
const maxLinks = 40

// OverridesTarget is the file an overrides path names once its symlinks
// are followed: the file itself when it is none. A dangling link names its
// target (made on the first write). An operator who links
// /etc/gpupin/overrides.yaml to a file on another volume keeps the link:
// writes go through it, and the lock is taken beside the real file, so
// every writer, whichever name it was given, takes the same lock.
func OverridesTarget(path string) (string, error) {
	if p, err := filepath.EvalSymlinks(path); err == nil {
		return p, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("overrides %s: %w", path, err)
	}
	// Something on the way does not exist: follow the links by hand to
	// the first name that is missing; that is the file to create.
	p := path
	for range maxLinks {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			// A missing directory on the way is made by the write.
			return filepath.Clean(p), nil
		}
		if err != nil {
			return "", fmt.Errorf("overrides %s: %w", path, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return filepath.Clean(p), nil
		}
		t, err := os.Readlink(p)
		if err != nil {
			return "", fmt.Errorf("overrides %s: %w", path, err)
		}
		if !filepath.IsAbs(t) {
			// Relative to the link's real directory: a ".." in the link
			// climbs out of where the directory really is, which a lexical
			// join would get wrong when the directory is itself a link.
			dir, err := filepath.EvalSymlinks(filepath.Dir(p))
			if err != nil {
				return "", fmt.Errorf("overrides %s: %w", path, err)
			}
			t = filepath.Join(dir, t)
		}
		p = t
	}
	return "", fmt.Errorf("overrides %s: more than %d symlinks", path, maxLinks)
}

// writeFileAtomic replaces the file path names, through its symlinks: the
// temporary file goes beside the target and is renamed over it, so a link
// stays a link.
func writeFileAtomic(path string, data []byte, mode fs.FileMode) (err error) {
	target, err := OverridesTarget(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	path = target
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// CreateTemp makes 0600 files; an explicit chmod also ignores the umask.
	if err = tmp.Chmod(mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// The rename is durable only once the directory entry is.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: open dir: %w", path, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync dir: %w", path, err)
	}
	return nil
}

// UpdateOverrides reads the overrides file, lets fn change it, and writes
// it back, holding a lock beside it the whole time: the CLI and the agent
// both write the file, and neither may lose the other's change. A
// symlinked file is written through, and locked beside its target (see
// OverridesTarget); the returned file keeps the path it was given.
func UpdateOverrides(path string, fn func(*OverrideFile) error) (*OverrideFile, error) {
	target, err := OverridesTarget(path)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return nil, fmt.Errorf("overrides dir: %w", err)
	}
	lock, err := os.OpenFile(lockPath(target), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock overrides: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock overrides: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	// Read and write the target found under the lock: were the link
	// repointed meanwhile, its new target has a lock of its own.
	of, err := LoadOverrides(target)
	if err != nil {
		return nil, err
	}
	if err := fn(of); err != nil {
		return nil, err
	}
	if err := of.Save(); err != nil {
		return nil, err
	}
	of.Path = path
	return of, nil
}

// lockPath is the lock file of an overrides file: a hidden file beside it.
func lockPath(target string) string {
	return filepath.Join(filepath.Dir(target), "."+filepath.Base(target)+".lock")
}
