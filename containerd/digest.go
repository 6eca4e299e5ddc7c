package containerd

import "github.com/opencontainers/go-digest"

func digestOf(s string) digest.Digest { return digest.Digest(s) }
