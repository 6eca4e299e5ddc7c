package pins

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"

	"github.com/gpupin/gpupin/containerd/conn"
)

// pinLockTTL is how long containerd keeps a pin lock whose holder never
// let go. It is long, as containerd's collector deletes an expired lease
// whether its holder still runs or not (a restore under the lock may
// unpack a large image); a holder that died is not waited out, as its
// lock is broken as soon as its owner is seen dead.
const pinLockTTL = 10 * time.Minute

// labelLockNonce tells one holding of a pin lock from the next, so that a
// holder lets go of its own lock only, never of one taken after it.
const labelLockNonce = "io.gpupin.lock-nonce"

// lockPinKey serialises the pin steps of one key across every process
// that uses this containerd namespace, gpupin's own lock directory or not:
// a lease of a fixed ID is a mutex the daemon keeps, since creating one
// that exists fails.
func (r *Store) lockPinKey(ctx context.Context, key string) (func(), error) {
	ls := r.conn.Client.LeasesService()
	id := pinLockID(key)
	nonce := rand.Text()
	// Known from before the request: a holding whose answer has not come
	// yet is this process's too, and never taken for an orphan.
	holding.Store(nonce, true)
	for {
		_, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(pinLockTTL),
			leases.WithLabels(map[string]string{conn.LabelManaged: "true", conn.LabelOwner: conn.Owner(), conn.LabelRole: "pin-lock", labelLockNonce: nonce}))
		if err == nil {
			return func() {
				releasePinLock(context.WithoutCancel(ctx), ls, id, nonce)
				holding.Delete(nonce)
			}, nil
		}
		if !errdefs.IsAlreadyExists(err) {
			// The daemon may still create it after this call gave up (a
			// deadline): such a lock is this process's, with a nonce no
			// call holds, and the next caller breaks it.
			holding.Delete(nonce)
			releasePinLock(context.WithoutCancel(ctx), ls, id, nonce)
			return nil, fmt.Errorf("lock pin %s: %w", key, err)
		}
		// Held: by a live pin step, or left by a dead one, or by a call of
		// this process that gave up before its lock was made. Only those
		// last two lose it; a live holder, however slow, keeps it.
		if held, err := ls.List(ctx, fmt.Sprintf("id==%q", id)); err == nil && len(held) == 1 && orphaned(held[0].Labels) {
			releasePinLock(ctx, ls, id, held[0].Labels[labelLockNonce])
			continue
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another pin step of %s: %w", key, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// holding holds the nonces of this process's pin locks, held or being
// asked for.
var holding sync.Map

// orphaned says whether a pin lock's holder is gone: its process died, or
// it is this process and no call of it holds that nonce.
func orphaned(labels map[string]string) bool {
	o := labels[conn.LabelOwner]
	if o == conn.Owner() {
		_, held := holding.Load(labels[labelLockNonce])
		return !held
	}
	return !conn.OwnerAlive(o)
}

// pinLockID names key's lock lease.
func pinLockID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "gpupin-pinlock-" + hex.EncodeToString(sum[:8])
}

// releasePinLock deletes the lock id if it is still the holding nonce
// names: a lock broken and taken by another meanwhile stays theirs.
func releasePinLock(ctx context.Context, ls leases.Manager, id, nonce string) {
	held, err := ls.List(ctx, fmt.Sprintf("id==%q", id))
	if err != nil || len(held) != 1 || held[0].Labels[labelLockNonce] != nonce {
		return
	}
	ls.Delete(ctx, held[0])
}
