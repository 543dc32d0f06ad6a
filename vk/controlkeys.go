package vk

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
)

// ControlKeys are the keys that derive the control plane's per-sandbox
// daemon tokens (ControlToken): the current key, which every new sandbox
// gets and every running one is moved to, and previous keys, still tried
// while sandboxes hold their tokens. Only sandman-vk holds them. Safe for
// concurrent use; Set replaces the whole set at once.
type ControlKeys struct {
	set atomic.Pointer[keySet]

	// mu guards changed: closed and replaced by each Set that changes
	// the keys.
	mu      sync.Mutex
	changed chan struct{}
}

// keySet is one generation of keys; never changed once stored.
type keySet struct {
	current  []byte
	previous [][]byte
}

// NewControlKeys returns a key set with current and previous keys.
func NewControlKeys(current []byte, previous ...[]byte) (*ControlKeys, error) {
	k := &ControlKeys{changed: make(chan struct{})}
	if err := k.Set(current, previous...); err != nil {
		return nil, err
	}
	return k, nil
}

// Set makes current the key for new tokens and keeps previous ones (in
// order) for sandboxes that still hold theirs. Empty keys, duplicates and a
// previous equal to current are dropped. A set that differs from the one
// before wakes Changed's waiters.
func (k *ControlKeys) Set(current []byte, previous ...[]byte) error {
	if len(current) == 0 {
		return errors.New("control keys: the current key is empty")
	}
	next := &keySet{current: clone(current)}
	for _, p := range previous {
		if len(p) == 0 || hmac.Equal(p, current) || next.has(p) {
			continue
		}
		next.previous = append(next.previous, clone(p))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if old := k.set.Load(); old != nil && old.equal(next) {
		return nil
	}
	k.set.Store(next)
	close(k.changed)
	k.changed = make(chan struct{})
	return nil
}

// Current is the key new tokens are derived from.
func (k *ControlKeys) Current() []byte { return k.set.Load().current }

// Previous are the keys sandboxes may still hold tokens of.
func (k *ControlKeys) Previous() [][]byte { return k.set.Load().previous }

// Changed is closed by the next Set that changes the keys.
func (k *ControlKeys) Changed() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.changed
}

func (s *keySet) has(key []byte) bool {
	if hmac.Equal(s.current, key) {
		return true
	}
	for _, p := range s.previous {
		if hmac.Equal(p, key) {
			return true
		}
	}
	return false
}

func (s *keySet) equal(o *keySet) bool {
	if !hmac.Equal(s.current, o.current) || len(s.previous) != len(o.previous) {
		return false
	}
	for i := range s.previous {
		if !hmac.Equal(s.previous[i], o.previous[i]) {
			return false
		}
	}
	return true
}

// tryOrder is the keys to try for a sandbox known to hold known (nil:
// not known): that one first while it is in the set, then the current
// key, the previous ones, and the current key once more when there are
// previous keys, so a re-key landing between two tries (the sandbox moved
// from a previous key to the current one) does not fail the call.
func (s *keySet) tryOrder(known []byte) [][]byte {
	var out [][]byte
	if known != nil && s.has(known) && !hmac.Equal(known, s.current) {
		out = append(out, known)
	}
	out = append(out, s.current)
	for _, p := range s.previous {
		if known == nil || !hmac.Equal(p, known) {
			out = append(out, p)
		}
	}
	if len(s.previous) > 0 {
		out = append(out, s.current)
	}
	return out
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// ControlToken is the control plane's bearer token for one sandbox: an
// HMAC of the pod UID under a control key. The daemon accepts it next to
// the creator's token; it never leaves the control plane.
func ControlToken(key []byte, podUID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(podUID))
	return hex.EncodeToString(m.Sum(nil))
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
