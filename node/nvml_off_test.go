//go:build !cgo || nonvml

package node

import (
	"context"
	"strings"
	"testing"
)

func TestReaderWithoutNVML(t *testing.T) {
	f, err := NewReader().Read(context.Background())
	if err != nil || f.Supported() || !strings.Contains(f.Unsupported, "built without NVML") || BuiltWithNVML {
		t.Errorf("facts = %+v, %v: want unsupported, built without NVML", f, err)
	}
}
