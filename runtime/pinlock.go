package runtime

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
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
func (r *Runtime) lockPinKey(ctx context.Context, key string) (func(), error) {
	ls := r.client.LeasesService()
	id := pinLockID(key)
	nonce := rand.Text()
	for {
		_, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(pinLockTTL),
			leases.WithLabels(map[string]string{LabelManaged: "true", LabelOwner: owner, LabelRole: "pin-lock", labelLockNonce: nonce}))
		if err == nil {
			return func() { releasePinLock(context.WithoutCancel(ctx), ls, id, nonce) }, nil
		}
		if !errdefs.IsAlreadyExists(err) {
			return nil, fmt.Errorf("lock pin %s: %w", key, err)
		}
		// Held: by a live pin step, or left by a dead one. Only a holder
		// seen dead loses it; a live one, however slow, keeps it.
		if held, err := ls.List(ctx, fmt.Sprintf("id==%q", id)); err == nil && len(held) == 1 &&
			!ownerAlive(held[0].Labels[LabelOwner]) {
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
