// Package leasecache is the filter's short-lived local token cache, shared by
// every VM of the plugin through proxy-wasm shared data with CAS.
//
// ABI 0.2.1 shared data has no delete and no TTL, so the cache is a fixed set
// of slots: a bucket hashes to two slots and sits in either (2-way set
// associative), and the slot records which bucket owns it. Every token in
// a slot was consumed in Redis before it was put there, and each is taken
// out by exactly one successful CAS, so the cache can only
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
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"unsafe"

	"github.com/tollgate-rl/tollgate/filter/internal/siphash"
	"github.com/tollgate-rl/tollgate/shared/identity"
)

// Store is shared data: proxywasm.GetSharedData / SetSharedData, with the
// host's rules (cpp-host, which Envoy embeds): a zero CAS writes
// unconditionally, a non-zero CAS must match an existing entry's, and on a
// missing key any CAS inserts. The data Get returns belongs to the caller,
// which may change it and write it back; Set does not keep data.
type Store interface {
	Get(key string) (data []byte, cas uint32, err error)
	Set(key string, data []byte, cas uint32) error
}

// A Peeker is a Store that can also read an entry into a buffer it reuses,
// valid until its next Peek, for a look that keeps nothing (Refills, which
// a VM's tick runs for every bucket it watches).
type Peeker interface {
	Peek(key string) ([]byte, error)
}

// Errors a Store returns.
var (
	ErrNotFound    = errors.New("leasecache: no such entry")
	ErrCasMismatch = errors.New("leasecache: cas mismatch")
)

// ErrTooLarge: an entry's strings do not fit a slot; it is not cached.
var ErrTooLarge = errors.New("leasecache: entry does not fit a slot")

// maxField bounds each string of an entry. The longest legal identity is a
// kind prefix ("user:") and 255 bytes; rule ids and tiers are shorter. A
// longer string is refused by Put, never cut: two identities that agree on
// their first bytes must not come back from the cache as one.
const maxField = 512

// Every legal identity fits a slot: this fails to compile if shared/identity
// ever allows ids longer than a slot holds (Put would then refuse them all,
// and those callers would call out on every request).
const _ = uint(maxField - len(identity.KindUser+":") - identity.MaxIDLen)

// The length prefix is a uint16: maxField must fit it.
const _ = uint16(maxField)

// maxRefusal bounds an entry's Refusal: a rule's response is at most a 4 KiB
// body and 16 headers of 64 + 512 bytes, with its JSON escapes.
const maxRefusal = 32 << 10

const _ = uint16(maxRefusal)

// maxCASRetries bounds the retries of one operation under contention.
const maxCASRetries = 8

// keyLen is the size of the shared hash key (SipHash's 128-bit key).
const keyLen = 16

// Entry is one bucket's cached state.
type Entry struct {
	Owner Owner
	// Tokens left of the lease, spendable until ExpiresMs.
	Tokens    int64
	ExpiresMs int64
	// DeniedUntilMs caches a denial until the wait is over.
	DeniedUntilMs int64
	// Spent counts the lease tokens spent locally since the control service
	// was last told (TakeSpent): usage counts requests made, not tokens
	// leased.
	Spent int64
	// The decision the lease came with, for the response headers.
	Limit, Remaining, ResetAt, WindowSeconds, RetryAfter, Quota int64
	RuleID, Identity, Tier, Strategy                            string
	// CostFrom is the cost_from of rule ChargeRule when the lease holds a
	// second pool, ChargeTokens, of that rule's tokens (a rule whose cost
	// the response reports: LLM tokens). A request is then admitted on a
	// token of each; it reads its response, and the response's cost is
	// paid from ChargeTokens first (TakeN).
	ChargeRule, CostFrom string
	ChargeTokens         int64
	// Refusal is a denial's own response (wire.AppendRefusal's JSON; ""
	// for the standard 429), so that every VM answers a cached denial as
	// the service's answer said.
	Refusal string
	// FallbackStartMs and FallbackCount count the requests let through by
	// Fallback in its current window, across the proxy's VMs.
	FallbackStartMs, FallbackCount int64
	// RefillUntilMs: a VM's callout for this bucket is in flight until at
	// most then (MarkRefill); the bucket's requests on other VMs wait for
	// the lease it brings instead of calling out too (Refilling). RefillID
	// names that callout: a request waits for one refill, never for the
	// next one that marks the slot. RefillBare is 1 when the last refill
	// ended bringing no lease (nor denial): until one brings a lease (Put),
	// the bucket's requests call out rather than wait for a refill that
	// will likely bring none either.
	RefillUntilMs, RefillID, RefillBare int64
	// LeasedAt and ChargeLeasedAt are the lease's stamps (wire.Lease),
	// opaque here: Take hands them back with the tokens of each pool for
	// the check to send.
	LeasedAt, ChargeLeasedAt int64
}

// Outcome of Take.
type Outcome int

const (
	Miss   Outcome = iota // ask the control service
	Hit                   // a token was taken locally
	Denied                // a cached denial is still in force
	// Refilling: nothing to spend, but a VM's callout for the bucket is
	// in flight (MarkRefill): take from what it brings (Take again) rather
	// than call out too.
	Refilling
)

// Cache is a view of the slots; it keeps no state of its own but the hash key.
type Cache struct {
	store  Store
	random func([]byte) error
	keys   []string
	keyKey string // the shared-data key holding the hash key
	k0, k1 uint64
	// buf is Put's encoding buffer (the Store copies what it is given).
	buf []byte
	// insertCAS is the CAS this VM writes a missing key with: by the host's
	// rules it inserts when the key is still missing and is refused when
	// another VM wrote the key in between (unless that write drew this very
	// CAS, one chance in 2^32, which Put's key check then repairs).
	insertCAS uint32
	// refills counts this VM's refill marks: a mark's id is the count with
	// insertCAS (random per VM) above it, unique among the VMs but once in
	// 2^32.
	refills uint32
}

// Owner identifies a bucket: the 128-bit keyed hash of its parts, never zero.
type Owner [16]byte

// New returns a cache over n slots named prefix.<i>, with the hash key shared
// by every VM under prefix.key (created by the first VM that finds none).
// random fills a buffer with random bytes (proxywasm.RandomBytes in the
// module: crypto/rand would arm a timer there, see that function).
func New(store Store, random func([]byte) error, prefix string, n uint32) (*Cache, error) {
	if n == 0 {
		return nil, errors.New("leasecache: no slots")
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + "." + strconv.Itoa(i)
	}
	c := &Cache{store: store, random: random, keys: keys, keyKey: prefix + ".key"}
	var r [4]byte
	if err := random(r[:]); err != nil {
		return nil, errors.New("leasecache: no randomness: " + err.Error())
	}
	c.insertCAS = max(binary.LittleEndian.Uint32(r[:]), 1)
	if err := c.loadKey(); err != nil {
		return nil, err
	}
	return c, nil
}

// loadKey adopts the process's hash key, creating it if there is none. The
// first VM to insert one wins; a VM that loses the race reads the winner's,
// so all VMs hash alike from their start.
func (c *Cache) loadKey() error {
	for i := 0; i < maxCASRetries; i++ {
		data, cas, err := c.store.Get(c.keyKey)
		switch {
		case err == nil && len(data) == keyLen:
			c.k0, c.k1 = siphash.KeyWords(data)
			return nil
		case err == nil:
			// Not a key (written by something else): replace this very
			// version of it, no other.
		case errors.Is(err, ErrNotFound):
			cas = c.insertCAS
		default:
			return errors.New("leasecache: read the hash key: " + err.Error())
		}
		var k [keyLen]byte
		if err := c.random(k[:]); err != nil {
			return errors.New("leasecache: no randomness for the hash key: " + err.Error())
		}
		switch err := c.store.Set(c.keyKey, k[:], cas); {
		case err == nil:
			c.k0, c.k1 = siphash.KeyWords(k[:])
			return nil
		case !errors.Is(err, ErrCasMismatch):
			return errors.New("leasecache: store the hash key: " + err.Error())
		}
		// Another VM stored its key first: read that one.
	}
	return errors.New("leasecache: the hash key keeps changing")
}

// Bucket is the owner id of a bucket's description: the keyed hash of its
// parts, each length-delimited so that no two lists of parts collide.
func (c *Cache) Bucket(parts ...string) Owner {
	b := c.NewBucket()
	b.Add(parts...)
	return b.Owner()
}

// BucketHasher computes an owner id part by part: adding the parts of a
// Bucket call one at a time, from strings or from bytes, gives the same
// owner. The filter hashes what it read where it lies, building no string
// for a part it does not keep.
type BucketHasher struct{ s siphash.State }

// NewBucket starts the owner id of a bucket.
func (c *Cache) NewBucket() BucketHasher { return BucketHasher{siphash.New(c.k0, c.k1)} }

// Add adds the next parts, in order (all at once costs one call: the
// filter hashes a request's parts on every request).
func (b *BucketHasher) Add(parts ...string) { b.s.AddParts(parts) }

// AddBytes adds the next part, held in a buffer. The hash reads the bytes
// during the call and keeps nothing of them, so they are read as a string
// where they lie rather than copied into one.
func (b *BucketHasher) AddBytes(part []byte) {
	b.s.AddParts([]string{unsafe.String(unsafe.SliceData(part), len(part))})
}

// Owner is the owner id of the parts added.
func (b *BucketHasher) Owner() Owner {
	h0, h1 := b.s.Sum()
	var o Owner
	binary.LittleEndian.PutUint64(o[:8], h0|1) // never zero: the zero Owner is no bucket
	binary.LittleEndian.PutUint64(o[8:], h1)
	return o
}

// ways are the slots owner's entry may sit in, w[:n] (the cache is 2-way
// set associative; a cache of one slot has one way): the high word of the
// owner and its low one, each scaled to the slot count (a multiply, not a
// modulo, so every slot is equally likely); the second is the next slot
// when they meet. Direct
// mapped, two callers active at once in one slot evicted each other's
// lease on every request, each of those requests calling out (in make
// bench's gateway run, 113 checks where the 98 other callers made 2, one
// run in four); two ways need three such callers.
func (c *Cache) ways(owner Owner) (w [2]string, n int) {
	slots := uint64(len(c.keys))
	i, _ := bits.Mul64(binary.LittleEndian.Uint64(owner[8:]), slots)
	j, _ := bits.Mul64(binary.LittleEndian.Uint64(owner[:8]), slots)
	if slots == 1 {
		return [2]string{c.keys[0]}, 1
	}
	if j == i {
		j = (i + 1) % slots
	}
	return [2]string{c.keys[i], c.keys[j]}, 2
}

// find reads the slot of owner's ways that holds its entry; k is "" when
// none does. peek reads it into the Store's reused buffer when it is a
// Peeker (no cas: for a look that keeps nothing).
func (c *Cache) find(owner Owner, peek bool) (k string, data []byte, cas uint32) {
	p, canPeek := c.store.(Peeker)
	w, n := c.ways(owner)
	for _, k := range w[:n] {
		var err error
		if peek && canPeek {
			data, err = p.Peek(k)
		} else {
			data, cas, err = c.store.Get(k)
		}
		if err == nil && len(data) >= len(owner) && Owner(data[:len(owner)]) == owner {
			return k, data, cas
		}
	}
	return "", nil, 0
}

// place picks the slot of owner's two to write, read for the write: the
// one holding owner's entry, else the one whose entry loses least (none,
// or one of no layout; then a spent one; then another bucket's refill
// mark; then its denial; then its live lease), the first on a tie. The
// caller decides whether what it holds may be replaced.
func (c *Cache) place(owner Owner, nowMs int64) (k string, data []byte, cas uint32, err error) {
	w, n := c.ways(owner)
	best := -1
	for _, slot := range w[:n] {
		d, cs, err := c.readForWrite(slot)
		if err != nil {
			return "", nil, 0, err
		}
		e, ok := decode(d, false)
		if ok && e.Owner == owner {
			return slot, d, cs, nil
		}
		rank := 0
		switch {
		case !ok:
		case e.leaseLive(nowMs):
			rank = 4
		case e.DeniedUntilMs > nowMs:
			rank = 3
		case e.RefillUntilMs > nowMs:
			rank = 2
		default:
			rank = 1
		}
		if best < 0 || rank < best {
			best, k, data, cas = rank, slot, d, cs
		}
	}
	return k, data, cas, nil
}

// Take spends one token of owner's lease (and one of its ChargeTokens,
// when it has that pool). On a Miss, returned is the count of expired lease
// tokens taken out of the slot, to be handed back to the control service
// with the next check (its returned field), and the Entry holds only Spent,
// ChargeTokens and LeasedAt: the lease tokens spent locally since the last
// Miss, for the same check to report (each is handed out once), the pool's
// tokens to hand back (charge_returned), and the lease's stamps to send
// with them (LeasedAt, ChargeLeasedAt); on Refilling, RefillID and RefillBare. The whole Entry is
// meaningful on a Hit or Denied.
func (c *Cache) Take(owner Owner, nowMs int64) (e Entry, out Outcome, returned int64) {
	var spent, chargeReturned, leasedAt, chargeLeasedAt int64
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas := c.find(owner, false)
		if k == "" {
			return Entry{}, Miss, 0
		}
		var ok bool
		if e, ok = decode(data, false); !ok || e.Owner != owner {
			return Entry{}, Miss, 0
		}
		// A lease of two pools admits only with a token of each; one whose
		// pool ran dry (its response costs) is used up.
		pooled := e.ChargeTokens > 0 || hasCostFrom(data)
		switch {
		case e.Tokens > 0 && nowMs < e.ExpiresMs && (!pooled || e.ChargeTokens > 0):
			// Paid-for tokens are spent even while a denial is cached: a
			// concurrent callout may have been denied after this lease was
			// granted.
			e.Tokens--
			if pooled {
				e.ChargeTokens--
			}
			e.Spent = satAdd(e.Spent, 1)
		case e.DeniedUntilMs > nowMs:
			viewStrings(data, &e)
			return e, Denied, 0
		case e.Tokens > 0 || e.ChargeTokens > 0 || e.Spent > 0:
			// Expired or used up: the check this Miss leads to hands back
			// the tokens left, with the lease's leased_at, and reports
			// those spent, once. Whether the tokens still count is the
			// service's to say, by Redis's clock: a window credits them
			// only in the window they came from (prelude.lua).
			returned, chargeReturned, spent = e.Tokens, e.ChargeTokens, e.Spent
			leasedAt, chargeLeasedAt = e.LeasedAt, e.ChargeLeasedAt
			e.Tokens, e.ChargeTokens, e.Spent = 0, 0, 0
		case e.RefillUntilMs > nowMs:
			return Entry{RefillID: e.RefillID, RefillBare: e.RefillBare}, Refilling, 0
		default:
			return Entry{}, Miss, 0
		}
		// Only the counts change: write them into the bytes just read
		// instead of encoding the entry again.
		binary.LittleEndian.PutUint64(data[offTokens:], uint64(e.Tokens))
		binary.LittleEndian.PutUint64(data[offSpent:], uint64(e.Spent))
		binary.LittleEndian.PutUint64(data[offCharge:], uint64(e.ChargeTokens))
		if err := c.store.Set(k, data, cas); err != nil {
			if errors.Is(err, ErrCasMismatch) {
				returned, chargeReturned, spent = 0, 0, 0
				continue
			}
			return Entry{}, Miss, 0
		}
		if returned > 0 || chargeReturned > 0 || spent > 0 {
			return Entry{Spent: spent, ChargeTokens: chargeReturned, LeasedAt: leasedAt, ChargeLeasedAt: chargeLeasedAt}, Miss, returned
		}
		viewStrings(data, &e)
		return e, Hit, 0
	}
	return Entry{}, Miss, 0
}

// TakeEnded takes what owner's lease left once it ended (nowMs at or past
// its ExpiresMs): its tokens, returned, with ChargeTokens, Spent and the
// stamps in e, as the Miss of Take that a next request would meet hands
// them back, and once (the slot keeps none of them). A lease still live,
// or none, gives nothing. For a bucket no request comes back to: its
// tokens would stay spent in the service's counters until their windows
// end.
func (c *Cache) TakeEnded(owner Owner, nowMs int64) (e Entry, returned int64) {
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas := c.find(owner, false)
		if k == "" {
			return Entry{}, 0
		}
		cur, ok := decode(data, false)
		if !ok || cur.Owner != owner || nowMs < cur.ExpiresMs || cur.Tokens <= 0 && cur.ChargeTokens <= 0 && cur.Spent <= 0 {
			return Entry{}, 0
		}
		binary.LittleEndian.PutUint64(data[offTokens:], 0)
		binary.LittleEndian.PutUint64(data[offSpent:], 0)
		binary.LittleEndian.PutUint64(data[offCharge:], 0)
		switch err := c.store.Set(k, data, cas); {
		case err == nil:
			return Entry{Spent: cur.Spent, ChargeTokens: cur.ChargeTokens, LeasedAt: cur.LeasedAt, ChargeLeasedAt: cur.ChargeLeasedAt}, cur.Tokens
		case !errors.Is(err, ErrCasMismatch):
			return Entry{}, 0
		}
	}
	return Entry{}, 0
}

// TakeN spends up to n of the ChargeTokens of owner's live lease of rule
// ruleID: the part of a response's cost the lease can pay. ok is false when
// the slot holds no such lease (taken is then 0); otherwise e is the entry
// after, and the rest of the cost, n - taken, is
// the control service's to charge. What is taken counts as Spent, reported
// with the next check like a lease hit's token.
func (c *Cache) TakeN(owner Owner, ruleID string, n, nowMs int64) (taken int64, e Entry, ok bool) {
	if n <= 0 {
		return 0, Entry{}, false
	}
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas := c.find(owner, false)
		if k == "" {
			return 0, Entry{}, false
		}
		if e, ok = decode(data, false); !ok || e.Owner != owner || e.ChargeTokens <= 0 || nowMs >= e.ExpiresMs {
			return 0, Entry{}, false
		}
		viewStrings(data, &e)
		if e.ChargeRule != ruleID || e.CostFrom == "" {
			return 0, Entry{}, false
		}
		taken = min(n, e.ChargeTokens)
		e.ChargeTokens -= taken
		e.Spent = satAdd(e.Spent, taken)
		binary.LittleEndian.PutUint64(data[offCharge:], uint64(e.ChargeTokens))
		binary.LittleEndian.PutUint64(data[offSpent:], uint64(e.Spent))
		switch err := c.store.Set(k, data, cas); {
		case err == nil:
			return taken, e, true
		case !errors.Is(err, ErrCasMismatch):
			return 0, Entry{}, false
		}
	}
	return 0, Entry{}, false
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
	if len(e.RuleID) > maxField || len(e.Identity) > maxField || len(e.Tier) > maxField || len(e.Strategy) > maxField ||
		len(e.ChargeRule) > maxField || len(e.CostFrom) > maxField || len(e.Refusal) > maxRefusal {
		return ErrTooLarge
	}
	e.Tokens, e.ChargeTokens = max(e.Tokens, 0), max(e.ChargeTokens, 0)
	if e.Tokens > 0 && c.keyReplaced() {
		// The entry was hashed with a key the other VMs no longer use:
		// drop it (under-admission, once) and use theirs from now on.
		return c.loadKey()
	}
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas, err := c.place(e.Owner, nowMs)
		if err != nil {
			return err
		}
		old, ok := decode(data, false)
		next := e
		if ok && old.Owner == e.Owner {
			// Tokens spent since the last report stay to be reported,
			// whatever this decision brings; an outage's counts stay for
			// the rest of their window.
			next.Spent, next.FallbackStartMs, next.FallbackCount = old.Spent, old.FallbackStartMs, old.FallbackCount
		}
		// A lease whose request tokens ran out may still hold its pool
		// (ChargeTokens): kept until a Take hands it back.
		live := ok && old.leaseLive(nowMs)
		switch {
		case live && old.Owner == e.Owner:
			next.Tokens = satAdd(old.Tokens, e.Tokens)
			next.ChargeTokens = satAdd(old.ChargeTokens, e.ChargeTokens)
			if e.CostFrom == "" && old.ChargeTokens > 0 {
				// A decision without a pool (no lease this time) keeps the
				// live one's rule: every request admitted on that pool
				// must read its response.
				viewStrings(data, &old)
				next.ChargeRule, next.CostFrom = old.ChargeRule, old.CostFrom
			}
			next.ExpiresMs, next.LeasedAt, next.ChargeLeasedAt = old.ExpiresMs, old.LeasedAt, old.ChargeLeasedAt
			if e.Tokens > 0 {
				// The merged tokens go back with the earlier stamp: the
				// later one would let the earlier window's tokens be
				// credited to the next (under-admission the other way).
				// No stamp (the service dropped it) is the earliest.
				next.ExpiresMs = min(old.ExpiresMs, e.ExpiresMs)
				next.LeasedAt = min(next.LeasedAt, e.LeasedAt)
			}
			if e.ChargeTokens > 0 {
				next.ChargeLeasedAt = min(next.ChargeLeasedAt, e.ChargeLeasedAt)
			}
		case live && e.Tokens == 0:
			return nil // a denial never evicts another bucket's live lease
		}
		c.buf = encodeInto(c.buf, &next) // Set copies it
		switch err := c.store.Set(k, c.buf, cas); {
		case err == nil:
			return nil
		case !errors.Is(err, ErrCasMismatch):
			return err
		}
	}
	return ErrCasMismatch
}

// MarkRefill records in owner's slot that this VM's callout for the bucket
// is in flight until at most untilMs, so that the bucket's requests on other
// VMs wait for its lease (Refilling) rather than each call out and take a
// lease of its own; id names the mark (EndRefill). It marks the bucket's
// own slot, an empty one, or one whose entry is spent (a lease would take
// that over anyway); never a slot with another bucket's live tokens or
// denial. False when nothing was marked: the other VMs call out as before,
// which only costs calls.
func (c *Cache) MarkRefill(owner Owner, untilMs, nowMs int64) (id int64, ok bool) {
	c.refills++
	id = int64(c.insertCAS)<<32 | int64(c.refills)
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas, err := c.place(owner, nowMs)
		if err != nil {
			return 0, false
		}
		old, ok := decode(data, false)
		switch {
		case ok && old.Owner == owner:
			// The bytes read are Get's to give (Set copies them).
			binary.LittleEndian.PutUint64(data[offRefill:], uint64(untilMs))
			binary.LittleEndian.PutUint64(data[offRefillID:], uint64(id))
		case ok && (old.DeniedUntilMs > nowMs || old.leaseLive(nowMs)):
			return 0, false
		default:
			c.buf = encodeInto(c.buf, &Entry{Owner: owner, RefillUntilMs: untilMs, RefillID: id})
			data = c.buf
		}
		switch err := c.store.Set(k, data, cas); {
		case err == nil:
			return id, true
		case !errors.Is(err, ErrCasMismatch):
			return 0, false
		}
	}
	return 0, false
}

// Refills reads the mark of owner's refill in flight at nowMs (0: none),
// writing nothing: a VM's tick asks it for every bucket it watches.
func (c *Cache) Refills(owner Owner, nowMs int64) (pending int64) {
	if e, ok := c.peek(owner); ok && e.RefillUntilMs > nowMs {
		return e.RefillID
	}
	return 0
}

// peek reads owner's entry without its strings, and without a CAS where the
// store can peek: for a read that writes nothing back.
func (c *Cache) peek(owner Owner) (Entry, bool) {
	k, data, _ := c.find(owner, true)
	if k == "" {
		return Entry{}, false
	}
	return decode(data, false)
}

// DeniedUntil is when the denial owner's slot holds ends (Unix ms), 0 when
// none is in force at nowMs: a read only (the filter's mark of a caller the
// service refused, which every VM's fallback reads).
func (c *Cache) DeniedUntil(owner Owner, nowMs int64) int64 {
	if e, ok := c.peek(owner); ok && e.DeniedUntilMs > nowMs {
		return e.DeniedUntilMs
	}
	return 0
}

// EndRefill ends owner's refill mark id (MarkRefill) once its callout is
// answered or failed: the other VMs' requests that waited for it decide
// now rather than when the mark runs out (a decision put in the slot has
// cleared it already). bare says the answer brought no lease nor denial,
// recorded as RefillBare. A later mark (another VM's refill) stays.
func (c *Cache) EndRefill(owner Owner, id int64, bare bool) {
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas := c.find(owner, false)
		if k == "" {
			return
		}
		e, ok := decode(data, false)
		if !ok || e.Owner != owner {
			return
		}
		ours := e.RefillUntilMs > 0 && e.RefillID == id
		switch {
		case bare && e.RefillBare != 1:
			binary.LittleEndian.PutUint64(data[offRefillBare:], 1)
		case !ours:
			return // nothing to change
		}
		if ours {
			binary.LittleEndian.PutUint64(data[offRefill:], 0)
		}
		if err := c.store.Set(k, data, cas); !errors.Is(err, ErrCasMismatch) {
			return
		}
	}
}

// readForWrite reads slot k to write it: a missing slot reads as empty,
// with the CAS that inserts only while it is still missing (an
// unconditional write could replace what another VM put meanwhile).
func (c *Cache) readForWrite(k string) ([]byte, uint32, error) {
	data, cas, err := c.store.Get(k)
	if errors.Is(err, ErrNotFound) {
		return nil, c.insertCAS, nil
	}
	return data, cas, err
}

// leaseLive reports whether e holds tokens of either pool spendable at nowMs
// (a lease whose request tokens ran out may still hold its pool).
func (e *Entry) leaseLive(nowMs int64) bool {
	return (e.Tokens > 0 || e.ChargeTokens > 0) && nowMs < e.ExpiresMs
}

// FallbackResult is what Fallback decided.
type FallbackResult struct {
	// Known: the slot held the owner's last decision, with a limit.
	Known   bool
	Allowed bool
	// WaitMs is how long a refused request should wait.
	WaitMs int64
	// Quota requests a window of WindowSeconds are let through while the
	// control service cannot be asked; Share is the share of the bucket's
	// limit (Quota in a window after the last decision's).
	Quota, WindowSeconds, Share int64
	// Entry is the last decision (strings included).
	Entry Entry
}

// Fallback decides a request of owner while the control service cannot be
// asked, from the last decision the proxy saw for the bucket: a denial
// still in force, or a window left with nothing (Remaining 0 until
// ResetAt), keeps refusing; otherwise share of the bucket's limit is let
// through per its window (in the window of the last decision, share of
// what that decision left), counted in the slot so that every VM of the
// proxy spends the same count. A bucket the slot does not know is not
// Known: the caller's configured fallback decides.
func (c *Cache) Fallback(owner Owner, nowMs int64, share float64) FallbackResult {
	for i := 0; i < maxCASRetries; i++ {
		k, data, cas := c.find(owner, false)
		if k == "" {
			return FallbackResult{}
		}
		e, ok := decode(data, true)
		if !ok || e.Owner != owner || e.Limit <= 0 || e.WindowSeconds <= 0 {
			return FallbackResult{}
		}
		r := FallbackResult{Known: true, Quota: shareOf(e.Limit, share), WindowSeconds: e.WindowSeconds, Entry: e}
		r.Share = r.Quota
		switch {
		case e.DeniedUntilMs > nowMs:
			r.WaitMs = e.DeniedUntilMs - nowMs
			return r
		case e.Remaining <= 0 && e.ResetAt > 0 && e.ResetAt*1000 > nowMs:
			r.WaitMs = e.ResetAt*1000 - nowMs
			return r
		}
		w := e.WindowSeconds * 1000
		start := nowMs - nowMs%w
		end := start + w
		if reset := e.ResetAt * 1000; reset > nowMs {
			// Still in the window of the last decision: what it left is
			// all there is (this proxy's share of it), not a whole share
			// of the limit on top of what the window admitted; counted in
			// that window, up to its reset, not in one of the grid's (the
			// service's windows are not on it: a grid boundary inside the
			// decision's window granted the share again).
			r.Quota = min(r.Quota, shareOf(e.Remaining, share))
			start, end = reset-w, reset
		}
		if e.FallbackStartMs != start {
			e.FallbackStartMs, e.FallbackCount = start, 0
		}
		if e.FallbackCount >= r.Quota {
			r.WaitMs = end - nowMs
			return r
		}
		e.FallbackCount++
		binary.LittleEndian.PutUint64(data[offFbStart:], uint64(e.FallbackStartMs))
		binary.LittleEndian.PutUint64(data[offFbCount:], uint64(e.FallbackCount))
		switch err := c.store.Set(k, data, cas); {
		case err == nil:
			r.Allowed, r.Entry = true, e
			return r
		case !errors.Is(err, ErrCasMismatch):
			return FallbackResult{}
		}
	}
	return FallbackResult{}
}

// shareOf is share of limit, at least 1.
func shareOf(limit int64, share float64) int64 {
	f := float64(limit) * share
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(int64(f), 1)
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// keyReplaced reports whether the shared hash key is no longer this VM's
// (checked when a lease is put, seldom: see insertCAS).
func (c *Cache) keyReplaced() bool {
	data, _, err := c.store.Get(c.keyKey)
	if err != nil || len(data) != keyLen {
		return false
	}
	k0, k1 := siphash.KeyWords(data)
	return k0 != c.k0 || k1 != c.k1
}

// A slot holds: the owner (16 bytes); Tokens, ExpiresMs, DeniedUntilMs,
// Limit, Remaining, ResetAt, WindowSeconds, RetryAfter, Quota, Spent,
// FallbackStartMs, FallbackCount, ChargeTokens, RefillUntilMs, RefillID,
// RefillBare, LeasedAt, ChargeLeasedAt (int64 each, little endian:
// Entry.ints);
// then RuleID,
// Identity, Tier, Strategy, ChargeRule, CostFrom and Refusal, each as a uint16 length
// and its bytes (a slot another layout wrote fails decode: a miss). Lengths above maxField (maxRefusal for Refusal)
// never occur (Put refuses them), so decode treats them as a damaged slot.
const (
	offTokens     = 16
	offSpent      = 88
	offFbStart    = 96
	offFbCount    = 104
	offCharge     = 112
	offRefill     = 120
	offRefillID   = 128
	offRefillBare = 136
	numInts       = 18
	fixedLen      = 16 + numInts*8
	numStrings    = 7
	minLen        = fixedLen + numStrings*2
)

// ints and strs list an Entry's fields in their slot order: encodeInto,
// decode and the string readers walk these instead of spelling each field
// out (the spelled-out versions were 9 kB of the module).
func (e *Entry) ints() [numInts]*int64 {
	return [numInts]*int64{&e.Tokens, &e.ExpiresMs, &e.DeniedUntilMs, &e.Limit, &e.Remaining,
		&e.ResetAt, &e.WindowSeconds, &e.RetryAfter, &e.Quota, &e.Spent, &e.FallbackStartMs,
		&e.FallbackCount, &e.ChargeTokens, &e.RefillUntilMs, &e.RefillID, &e.RefillBare, &e.LeasedAt, &e.ChargeLeasedAt}
}

func (e *Entry) strs() [numStrings]*string {
	return [numStrings]*string{&e.RuleID, &e.Identity, &e.Tier, &e.Strategy, &e.ChargeRule, &e.CostFrom, &e.Refusal}
}

// encodeInto writes e's slot bytes over buf's storage (Put reuses one
// buffer: a slot is written on every callout).
func encodeInto(buf []byte, e *Entry) []byte {
	b := append(buf[:0], e.Owner[:]...)
	for _, p := range e.ints() {
		b = binary.LittleEndian.AppendUint64(b, uint64(*p))
	}
	for _, p := range e.strs() {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(*p))) // Put bounds the lengths to maxField
		b = append(b, *p...)
	}
	return b
}

// decode reads a slot, checking its whole layout. The strings are only read
// when asked for (the owner check comes first and usually settles a Take).
func decode(b []byte, withStrings bool) (Entry, bool) {
	if len(b) < minLen {
		return Entry{}, false
	}
	rest := b[fixedLen:]
	for i := range numStrings {
		if len(rest) < 2 {
			return Entry{}, false
		}
		n := int(binary.LittleEndian.Uint16(rest))
		if n > maxField && (i < numStrings-1 || n > maxRefusal) || len(rest) < 2+n {
			return Entry{}, false
		}
		rest = rest[2+n:]
	}
	if len(rest) != 0 {
		return Entry{}, false
	}
	var e Entry
	copy(e.Owner[:], b[:16])
	for i, p := range e.ints() {
		*p = int64(binary.LittleEndian.Uint64(b[16+8*i:]))
	}
	if withStrings {
		decodeStrings(b, &e)
	}
	return e, true
}

// hasCostFrom reports whether a slot decode has checked names a cost_from
// (a lease of two pools), without reading the other strings.
func hasCostFrom(b []byte) bool {
	rest := b[fixedLen:]
	for range 5 { // RuleID, Identity, Tier, Strategy, ChargeRule
		rest = rest[2+int(binary.LittleEndian.Uint16(rest)):]
	}
	return binary.LittleEndian.Uint16(rest) != 0
}

// viewStrings is decodeStrings without the copy, for Take: the slot's bytes
// are the Store's answer, which belongs to Take (Store.Get) and which
// nothing writes again once Take returns (Set copies it), so the strings can
// be read where they lie. This runs on every lease hit.
func viewStrings(b []byte, e *Entry) {
	rest := b[fixedLen:]
	for _, p := range e.strs() {
		n := int(rest[0]) | int(rest[1])<<8
		*p = ""
		if n > 0 {
			*p = unsafe.String(&rest[2], n)
		}
		rest = rest[2+n:]
	}
}

// decodeStrings fills e's strings from a slot decode has checked, with one
// allocation for all.
func decodeStrings(b []byte, e *Entry) {
	s := string(b[fixedLen:])
	for _, p := range e.strs() {
		n := int(s[0]) | int(s[1])<<8
		*p, s = s[2:2+n], s[2+n:]
	}
}
