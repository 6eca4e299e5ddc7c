package node

import "context"

// Reader reads the facts of the node it runs on.
type Reader interface {
	Read(ctx context.Context) (*Facts, error)
}

// Static is a Reader of fixed facts: simulated nodes, facts from a file.
type Static struct{ Facts *Facts }

// Read returns a copy of the fixed facts.
func (s Static) Read(context.Context) (*Facts, error) {
	f := *s.Facts
	f.GPUs = append([]GPU(nil), s.Facts.GPUs...)
	return &f, nil
}

// File is a Reader of a facts file (the JSON `gpupin detect --json`
// prints), read again at every Read, so an edit of the file is a driver
// upgrade of the simulated node. Its facts are marked simulated.
func File(path string) Reader { return file(path) }

type file string

func (f file) Read(context.Context) (*Facts, error) { return LoadFile(string(f)) }
