package provision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// keyLocks serialises provisions of one pin key within a process, whatever
// wants they come from, also when no lock directory is in use.
type keyLocks struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (k *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]chan struct{}{}
	}
	ch, ok := k.m[key]
	if !ok {
		ch = make(chan struct{}, 1)
		k.m[key] = ch
	}
	k.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another provision of %s: %w", key, ctx.Err())
	}
}

// lock takes the pin key: in this process, then across processes.
func (p *Provisioner) lock(ctx context.Context, key string) (func(), error) {
	unlock, err := p.keys.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	funlock, err := lockKey(ctx, p.opts.LockDir, p.lockScope()+"\x00"+key)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() { funlock(); unlock() }, nil
}

// lockScope keeps keys of different containerd namespaces apart: they are
// different sets of pins.
func (p *Provisioner) lockScope() string { return p.rt.Namespace() }

// lockKey takes an exclusive file lock for one pin key on this node, so
// that two processes (the agent and an operator's `gpupin provision`) do
// not provision it at once: the second waits, then finds the first's pin.
// The kernel drops the lock when the process dies, so a crash never
// leaves it held.
func lockKey(ctx context.Context, dir, key string) (func(), error) {
	if dir == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lock dir: %w", err)
	}
	sum := sha256.Sum256([]byte(key))
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", key, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", key, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another gpupin provisioning %s: %w", key, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
