package agent

import "github.com/fsnotify/fsnotify"

// SetNewWatcher replaces how Watch makes its file watcher, until the
// returned func puts it back: a test makes it fail as an exhausted
// inotify does.
func SetNewWatcher(f func() (*fsnotify.Watcher, error)) (restore func()) {
	old := newWatcher
	newWatcher = f
	return func() { newWatcher = old }
}

// SetDefaultOverridesPath moves the overrides file Run reads by default
// (images.DefaultOverridesPath) into a test's directory.
func SetDefaultOverridesPath(p string) (restore func()) {
	old := defaultOverridesPath
	defaultOverridesPath = p
	return func() { defaultOverridesPath = old }
}
