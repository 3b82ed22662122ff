// Package leasecache is the filter's short-lived local token cache, shared by
// every VM of the plugin through proxy-wasm shared data with CAS.
//
// ABI 0.2.1 shared data has no delete and no TTL, so the cache is a fixed set
// of slots: a bucket hashes to a slot, and the slot records which bucket owns
// it. Every token in a slot was consumed in Redis before it was put there, and
// each is taken out by exactly one successful CAS, so the cache can only
// under-admit (tokens lost when a slot is overwritten or expires), never
// over-admit.
//
// A bucket's slot and its owner id come from a keyed hash (SipHash-2-4-128)
// whose key is random per Envoy process and shared by its VMs: no client can
// compute a path that lands in another caller's slot, and the 128-bit owner
// check does not confuse two buckets. A cached denial never evicts another
// bucket's live lease, and an entry that does not fit its fields is not
// cached (nothing is ever truncated into looking like another caller).
package leasecache

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
)

// Store is shared data: proxywasm.GetSharedData / SetSharedData.
type Store interface {
	Get(key string) (data []byte, cas uint32, err error)
	Set(key string, data []byte, cas uint32) error
}

// Errors a Store returns.
var (
	ErrNotFound    = errors.New("leasecache: no such entry")
	ErrCasMismatch = errors.New("leasecache: cas mismatch")
)

// ErrTooLarge: an entry's strings do not fit a slot; it is not cached.
var ErrTooLarge = errors.New("leasecache: entry does not fit a slot")

// maxField bounds each string of an entry. Identities are at most a kind
// prefix and 255 bytes; rule ids and tiers are shorter.
const maxField = 512

// maxCASRetries bounds the retries of one operation under contention.
const maxCASRetries = 8

// Entry is one bucket's cached state.
type Entry struct {
	Owner Owner
	// Tokens left of the lease, spendable until ExpiresMs.
	Tokens    int64
	ExpiresMs int64
	// DeniedUntilMs caches a denial until the wait is over.
	DeniedUntilMs int64
	// The decision the lease came with, for the response headers.
	Limit, Remaining, ResetAt, WindowSeconds, RetryAfter int64
	RuleID, Identity, Tier                               string
}

// Outcome of Take.
type Outcome int

const (
	Miss   Outcome = iota // ask the control service
	Hit                   // a token was taken locally
	Denied                // a cached denial is still in force
)

// Cache is a view of the slots; it keeps no state of its own but the hash key.
type Cache struct {
	store  Store
	keys   []string
	keyKey string // the shared-data key holding the hash key
	k0, k1 uint64
}

// Owner identifies a bucket: 128 bits of a keyed hash, never zero.
type Owner [16]byte

// New returns a cache over n slots named prefix.<i>, with the hash key shared
// by every VM under prefix.key (created by the first VM that finds none).
func New(store Store, prefix string, n uint32) (*Cache, error) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + "." + strconv.Itoa(i)
	}
	c := &Cache{store: store, keys: keys, keyKey: prefix + ".key"}
	if err := c.loadKey(); err != nil {
		return nil, err
	}
	return c, nil
}

// loadKey adopts the process's hash key, creating it if there is none.
// Shared data has no insert-if-absent, so two VMs starting at once may both
// write one: each then adopts what is stored, and Put checks again, so the
// VMs agree from the first lease after such a race on.
func (c *Cache) loadKey() error {
	data, _, err := c.store.Get(c.keyKey)
	if errors.Is(err, ErrNotFound) || (err == nil && len(data) != 16) {
		var k [16]byte
		if _, err := rand.Read(k[:]); err != nil {
			return errors.New("leasecache: no randomness for the hash key: " + err.Error())
		}
		if err := c.store.Set(c.keyKey, k[:], 0); err != nil {
			return errors.New("leasecache: store the hash key: " + err.Error())
		}
		data, _, err = c.store.Get(c.keyKey)
	}
	if err != nil || len(data) != 16 {
		return errors.New("leasecache: read the hash key")
	}
	c.k0, c.k1 = binary.LittleEndian.Uint64(data[:8]), binary.LittleEndian.Uint64(data[8:])
	return nil
}

// Bucket is the owner id of a bucket's description: the keyed hash of its
// parts, each preceded by its length so that no two lists of parts collide.
func (c *Cache) Bucket(parts ...string) Owner {
	h := newSip(c.k0, c.k1)
	for _, p := range parts {
		n := uint32(len(p))
		h.writeByte(byte(n))
		h.writeByte(byte(n >> 8))
		h.writeByte(byte(n >> 16))
		h.writeByte(byte(n >> 24))
		h.writeString(p)
	}
	h0, h1 := h.sum128()
	var o Owner
	binary.LittleEndian.PutUint64(o[:8], h0|1) // never zero: zero marks no owner
	binary.LittleEndian.PutUint64(o[8:], h1)
	return o
}

func (c *Cache) key(owner Owner) string {
	return c.keys[binary.LittleEndian.Uint64(owner[:8])%uint64(len(c.keys))]
}

// Take spends one token of owner's lease. On a Miss, leftover is the count of
// expired lease tokens taken out of the slot, to be handed back to the
// control service with the next check.
func (c *Cache) Take(owner Owner, nowMs int64) (e Entry, out Outcome, leftover int64) {
	k := c.key(owner)
	for i := 0; i < maxCASRetries; i++ {
		data, cas, err := c.store.Get(k)
		if err != nil {
			return Entry{}, Miss, 0
		}
		e, ok := decode(data)
		if !ok || e.Owner != owner {
			return Entry{}, Miss, 0
		}
		switch {
		case e.Tokens > 0 && nowMs < e.ExpiresMs:
			// Paid-for tokens are spent even while a denial is cached: a
			// concurrent callout may have been denied after this lease was
			// granted.
			e.Tokens--
		case e.DeniedUntilMs > nowMs:
			return e, Denied, 0
		case e.Tokens > 0:
			leftover, e.Tokens = e.Tokens, 0 // expired: hand back once
		default:
			return e, Miss, 0
		}
		if err := c.store.Set(k, encode(e), cas); err != nil {
			if errors.Is(err, ErrCasMismatch) {
				continue
			}
			return Entry{}, Miss, 0
		}
		if leftover > 0 {
			return e, Miss, leftover
		}
		return e, Hit, 0
	}
	return Entry{}, Miss, 0
}

// Put stores a fresh decision for e.Owner. A live lease of the same bucket
// is kept and the new tokens are added to it (concurrent callouts of one
// caller each bring a lease; overwriting would throw paid-for tokens away),
// spendable until the earlier of the two expiries. A slot of another bucket
// is taken over by a lease (its tokens are lost, which only under-admits),
// but never by a denial while it holds live tokens: denials are what a
// client can cause at will. An entry whose strings do not fit is refused
// with ErrTooLarge and nothing is cached.
func (c *Cache) Put(e Entry, nowMs int64) error {
	if len(e.RuleID) > maxField || len(e.Identity) > maxField || len(e.Tier) > maxField {
		return ErrTooLarge
	}
	if e.Tokens > 0 && c.keyReplaced() {
		// The entry was hashed with a key the other VMs no longer use:
		// drop it (under-admission, once) and use theirs from now on.
		return c.loadKey()
	}
	k := c.key(e.Owner)
	for i := 0; i < maxCASRetries; i++ {
		data, cas, err := c.store.Get(k)
		if err != nil {
			return c.store.Set(k, encode(e), 0)
		}
		old, ok := decode(data)
		next := e
		live := ok && old.Tokens > 0 && nowMs < old.ExpiresMs
		switch {
		case live && old.Owner == e.Owner:
			next.Tokens = old.Tokens + e.Tokens
			next.ExpiresMs = old.ExpiresMs
			if e.Tokens > 0 {
				next.ExpiresMs = min(old.ExpiresMs, e.ExpiresMs)
			}
		case live && e.Tokens == 0:
			return nil // a denial never evicts another bucket's live lease
		}
		switch err := c.store.Set(k, encode(next), cas); {
		case err == nil:
			return nil
		case !errors.Is(err, ErrCasMismatch):
			return err
		}
	}
	return ErrCasMismatch
}

// keyReplaced reports whether the shared hash key is no longer this VM's
// (checked when a lease is put, seldom: see loadKey).
func (c *Cache) keyReplaced() bool {
	data, _, err := c.store.Get(c.keyKey)
	return err == nil && len(data) == 16 &&
		(binary.LittleEndian.Uint64(data[:8]) != c.k0 || binary.LittleEndian.Uint64(data[8:]) != c.k1)
}

const fixedLen = 16 + 8*8

func encode(e Entry) []byte {
	b := make([]byte, fixedLen, fixedLen+6+len(e.RuleID)+len(e.Identity)+len(e.Tier))
	copy(b, e.Owner[:])
	for i, v := range []uint64{uint64(e.Tokens), uint64(e.ExpiresMs), uint64(e.DeniedUntilMs),
		uint64(e.Limit), uint64(e.Remaining), uint64(e.ResetAt), uint64(e.WindowSeconds), uint64(e.RetryAfter)} {
		binary.LittleEndian.PutUint64(b[16+8*i:], v)
	}
	for _, s := range []string{e.RuleID, e.Identity, e.Tier} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s))) // Put bounds them to maxField
		b = append(b, s...)
	}
	return b
}

func decode(b []byte) (Entry, bool) {
	if len(b) < fixedLen+6 {
		return Entry{}, false
	}
	u := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[16+8*i:])) }
	e := Entry{Tokens: u(0), ExpiresMs: u(1), DeniedUntilMs: u(2),
		Limit: u(3), Remaining: u(4), ResetAt: u(5), WindowSeconds: u(6), RetryAfter: u(7)}
	copy(e.Owner[:], b[:16])
	rest := b[fixedLen:]
	var strs [3]string
	for i := range strs {
		if len(rest) < 2 {
			return Entry{}, false
		}
		n := int(binary.LittleEndian.Uint16(rest))
		if n > maxField || len(rest) < 2+n {
			return Entry{}, false
		}
		strs[i] = string(rest[2 : 2+n])
		rest = rest[2+n:]
	}
	if len(rest) != 0 {
		return Entry{}, false
	}
	e.RuleID, e.Identity, e.Tier = strs[0], strs[1], strs[2]
	return e, true
}
