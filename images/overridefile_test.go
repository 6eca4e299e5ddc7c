package images

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A symlinked overrides file is written through its link, atomically
// beside the target, and locked beside the target: the link stays, and a
// writer that names the target and one that names the link take one lock.
func TestUpdateOverridesThroughSymlink(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup makes the link in etc/ and returns its path and the target's.
		setup func(t *testing.T, root string) (link, target string)
	}{
		{"absolute link", func(t *testing.T, root string) (string, string) {
			target := filepath.Join(root, "data", "overrides.yaml")
			mustWrite(t, target, "overrides:\n  sglang: none\n")
			return mustLink(t, target, filepath.Join(root, "etc", "overrides.yaml")), target
		}},
		{"relative link", func(t *testing.T, root string) (string, string) {
			target := filepath.Join(root, "data", "overrides.yaml")
			mustWrite(t, target, "overrides:\n  sglang: none\n")
			return mustLink(t, "../data/overrides.yaml", filepath.Join(root, "etc", "overrides.yaml")), target
		}},
		{"chain of links", func(t *testing.T, root string) (string, string) {
			target := filepath.Join(root, "data", "overrides.yaml")
			mustWrite(t, target, "overrides:\n  sglang: none\n")
			mid := mustLink(t, target, filepath.Join(root, "mid", "overrides.yaml"))
			return mustLink(t, mid, filepath.Join(root, "etc", "overrides.yaml")), target
		}},
		{"dangling link", func(t *testing.T, root string) (string, string) {
			// The target, and its directory, are made by the first write.
			target := filepath.Join(root, "data", "new", "overrides.yaml")
			return mustLink(t, target, filepath.Join(root, "etc", "overrides.yaml")), target
		}},
		{"dangling relative chain", func(t *testing.T, root string) (string, string) {
			target := filepath.Join(root, "data", "overrides.yaml")
			os.MkdirAll(filepath.Dir(target), 0o755)
			mustLink(t, "../data/overrides.yaml", filepath.Join(root, "mid", "overrides.yaml"))
			return mustLink(t, "../mid/overrides.yaml", filepath.Join(root, "etc", "overrides.yaml")), target
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			link, target := tc.setup(t, root)
			before, _ := os.Readlink(link)
			had, _ := os.ReadFile(target)

			// Another writer holds the lock beside the target: an update
			// through the link must wait for it.
			os.MkdirAll(filepath.Dir(target), 0o755)
			held, err := os.OpenFile(filepath.Join(filepath.Dir(target), ".overrides.yaml.lock"), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var of *OverrideFile
			go func() {
				var err error
				of, err = UpdateOverrides(link, func(of *OverrideFile) error {
					_, err := of.Set("vllm", "cu129")
					return err
				})
				done <- err
			}()
			select {
			case err := <-done:
				t.Fatalf("the update did not wait for the lock beside the target (err %v)", err)
			case <-time.After(300 * time.Millisecond):
			}
			syscall.Flock(int(held.Fd()), syscall.LOCK_UN)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if of.Path != link {
				t.Errorf("returned path %s, want the one given, %s", of.Path, link)
			}

			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("the link was replaced (%v, %v)", fi.Mode(), err)
			}
			if now, _ := os.Readlink(link); now != before {
				t.Errorf("link now points to %q, was %q", now, before)
			}
			got, err := LoadOverrides(target)
			if err != nil {
				t.Fatal(err)
			}
			if got.Overrides["vllm"] != "cu129" || (len(had) > 0 && got.Overrides["sglang"] != "none") {
				t.Errorf("target holds %v (had %q)", got.Overrides, had)
			}
			// Nothing beside the link: no lock, no temporary file.
			entries, _ := os.ReadDir(filepath.Dir(link))
			for _, e := range entries {
				if e.Name() != filepath.Base(link) {
					t.Errorf("left beside the link: %s", e.Name())
				}
			}
			entries, _ = os.ReadDir(filepath.Dir(target))
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".tmp") {
					t.Errorf("temporary file left beside the target: %s", e.Name())
				}
			}
			// Save through the link writes through it too.
			of.Set("vllm", "none")
			if err := of.Save(); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("Save replaced the link (%v, %v)", fi.Mode(), err)
			}
			if got, _ := LoadOverrides(target); got.Overrides["vllm"] != "none" {
				t.Errorf("Save through the link: target holds %v", got.Overrides)
			}
		})
	}
}

func TestOverridesTargetLoop(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.Symlink(b, a)
	os.Symlink(a, b)
	if _, err := UpdateOverrides(a, func(*OverrideFile) error { return nil }); err == nil {
		t.Fatal("a loop of links was written")
	}
	if p, err := OverridesTarget(filepath.Join(dir, "plain.yaml")); err != nil || p != filepath.Join(dir, "plain.yaml") {
		t.Fatalf("a missing plain file: %q, %v", p, err)
	}
}

func mustWrite(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, target, link string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return link
}
