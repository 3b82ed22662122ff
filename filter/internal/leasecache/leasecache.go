// Package leasecache is the filter's short-lived local token cache, shared by
// every VM of the plugin through proxy-wasm shared data with CAS.
//
// ABI 0.2.1 shared data has no delete and no TTL, so the cache is a fixed set
// of slots: a bucket hashes to a slot, and the slot records which bucket owns
// it. Every token in a slot was consumed in Redis before it was put there, and
// each is taken out by exactly one successful CAS, so the cache can only
// under-admit (tokens lost when a slot is overwritten or expires), never
// over-admit.
package leasecache

import (
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

// Cache is a view of the slots; it keeps no state of its own.
type Cache struct {
	store Store
	keys  []string
}

// New returns a cache over n slots named prefix.<i>.
func New(store Store, prefix string, n uint32) *Cache {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + "." + strconv.Itoa(i)
	}
	return &Cache{store: store, keys: keys}
}

// Owner identifies a bucket.
type Owner = uint64

// Bucket is the owner id of a bucket's description (see the package Bucket).
func (c *Cache) Bucket(parts ...string) Owner { return Bucket(parts...) }

// Bucket hashes a bucket's description to its owner id (FNV-1a over the
// parts, each followed by a NUL; inline, so the hot path allocates nothing).
func Bucket(parts ...string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			h = (h ^ uint64(p[i])) * prime
		}
		h *= prime // the NUL separator: h ^ 0 == h
	}
	return h | 1 // 0 marks an empty slot
}

func (c *Cache) key(owner uint64) string { return c.keys[owner%uint64(len(c.keys))] }

// Take spends one token of owner's lease. On a Miss, leftover is the count of
// expired lease tokens taken out of the slot, to be handed back to the
// control service with the next check.
func (c *Cache) Take(owner uint64, nowMs int64) (e Entry, out Outcome, leftover int64) {
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
// spendable until the earlier of the two expiries. A slot of another bucket is
// taken over: its tokens are lost, which only under-admits.
func (c *Cache) Put(e Entry, nowMs int64) error {
	k := c.key(e.Owner)
	for i := 0; i < maxCASRetries; i++ {
		data, cas, err := c.store.Get(k)
		if err != nil {
			return c.store.Set(k, encode(e), 0)
		}
		old, ok := decode(data)
		next := e
		if ok && old.Owner == e.Owner && old.Tokens > 0 && nowMs < old.ExpiresMs {
			next.Tokens = old.Tokens + e.Tokens
			next.ExpiresMs = old.ExpiresMs
			if e.Tokens > 0 {
				next.ExpiresMs = min(old.ExpiresMs, e.ExpiresMs)
			}
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

const fixedLen = 8 * 10

func encode(e Entry) []byte {
	b := make([]byte, fixedLen, fixedLen+3+len(e.RuleID)+len(e.Identity)+len(e.Tier))
	for i, v := range []uint64{e.Owner, uint64(e.Tokens), uint64(e.ExpiresMs), uint64(e.DeniedUntilMs),
		uint64(e.Limit), uint64(e.Remaining), uint64(e.ResetAt), uint64(e.WindowSeconds), uint64(e.RetryAfter), 0} {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	for _, s := range []string{e.RuleID, e.Identity, e.Tier} {
		if len(s) > 255 {
			s = s[:255]
		}
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	return b
}

func decode(b []byte) (Entry, bool) {
	if len(b) < fixedLen+3 {
		return Entry{}, false
	}
	u := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
	e := Entry{Owner: uint64(u(0)), Tokens: u(1), ExpiresMs: u(2), DeniedUntilMs: u(3),
		Limit: u(4), Remaining: u(5), ResetAt: u(6), WindowSeconds: u(7), RetryAfter: u(8)}
	rest := b[fixedLen:]
	var strs [3]string
	for i := range strs {
		if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
			return Entry{}, false
		}
		n := int(rest[0])
		strs[i] = string(rest[1 : 1+n])
		rest = rest[1+n:]
	}
	e.RuleID, e.Identity, e.Tier = strs[0], strs[1], strs[2]
	return e, true
}
