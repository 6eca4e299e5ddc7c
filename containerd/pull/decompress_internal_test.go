package pull

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The gzip command is the caller's choice (WithDecompress), never the
// environment's: with containerd's variables set, a Puller made without
// the option still runs igzip. Each choice is run over a real gzip stream
// through stand-ins for igzip and unpigz that say they ran and then hand
// over to the real gzip.
func TestDecompressIsTheCallersChoice(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "ran")
	for _, name := range []string{"igzip", "unpigz"} {
		script := "#!/bin/sh\necho " + name + " >> \"$GPUPIN_TEST_MARK\"\nexec gzip \"$@\"\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("GPUPIN_TEST_MARK", mark)
	// Read by the CLI alone: they must change nothing here.
	t.Setenv(EnvDisableIgzip, "1")
	t.Setenv(EnvDisablePigz, "1")

	want := bytes.Repeat([]byte("a layer's tar stream "), 4096)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(want)
	zw.Close()

	tests := []struct {
		name string
		opts []Option
		cmd  string // the command that runs; "" for Go's decoder
	}{
		{"default", nil, "igzip"},
		{"nothing turned off", []Option{WithDecompress(DecompressOptions{})}, "igzip"},
		{"no igzip", []Option{WithDecompress(DecompressOptions{NoIgzip: true})}, "unpigz"},
		{"no unpigz", []Option{WithDecompress(DecompressOptions{NoPigz: true})}, "igzip"},
		{"neither", []Option{WithDecompress(DecompressOptions{NoIgzip: true, NoPigz: true})}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(mark)
			r := New(nil, tc.opts...)
			defer r.Close()
			if wantPath := filepath.Join(dir, tc.cmd); (tc.cmd == "" && r.gzip != "") || (tc.cmd != "" && r.gzip != wantPath) {
				t.Fatalf("the puller's gzip command is %q, want %q", r.gzip, tc.cmd)
			}
			rc, err := decompress(context.Background(), bytes.NewReader(gz.Bytes()), nil, r.gzip)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("decompressed %d bytes (err %v), want the %d written", len(got), err, len(want))
			}
			ran, _ := os.ReadFile(mark)
			if strings.TrimSpace(string(ran)) != tc.cmd {
				t.Fatalf("ran %q, want %q", strings.TrimSpace(string(ran)), tc.cmd)
			}
		})
	}
}
