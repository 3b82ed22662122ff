package leasecache

import (
	"bytes"
	"crypto/rand"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/identity"
)

// memStore is shared data with cpp-host's rules (the host Envoy embeds): one
// CAS counter for all keys, a zero CAS writes unconditionally, a non-zero CAS
// must match an existing entry's, and on a missing key any CAS inserts.
type memStore struct {
	mu   sync.Mutex
	next uint32
	m    map[string]memEntry
}

type memEntry struct {
	v   []byte
	cas uint32
}

func newMemStore() *memStore { return &memStore{m: map[string]memEntry{}} }

func (s *memStore) Get(k string) ([]byte, uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[k]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return bytes.Clone(e.v), e.cas, nil
}

func (s *memStore) Set(k string, v []byte, cas uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[k]; ok && cas != 0 && e.cas != cas {
		return ErrCasMismatch
	}
	s.next++
	s.m[k] = memEntry{v: bytes.Clone(v), cas: s.next}
	return nil
}

// hookStore runs onMiss once, the first time a Get of key finds nothing,
// after that Get has read the store: it is another VM acting between this
// VM's read and its write.
type hookStore struct {
	*memStore
	key    string
	onMiss func()
}

func (h *hookStore) Get(k string) ([]byte, uint32, error) {
	d, cas, err := h.memStore.Get(k)
	if k == h.key && errors.Is(err, ErrNotFound) && h.onMiss != nil {
		f := h.onMiss
		h.onMiss = nil
		f()
	}
	return d, cas, err
}

// newCache is a cache over s, named as the tests' slots are.
func newCache(t testing.TB, s Store, slots uint32) *Cache {
	t.Helper()
	c, err := New(s, randomBytes, "tg", slots)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DeniedUntil reads a denial in force, and nothing of another bucket's or
// of one that ended; it spends nothing.
func TestDeniedUntil(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	a, b := c.Bucket("\x00refused", "ip:192.0.2.1"), c.Bucket("\x00refused", "ip:192.0.2.2")
	if got := c.DeniedUntil(a, 1000); got != 0 {
		t.Fatalf("empty cache: %d", got)
	}
	c.Put(Entry{Owner: a, Limit: 3, WindowSeconds: 60, DeniedUntilMs: 61_000}, 1000)
	for _, tc := range []struct {
		owner     Owner
		now, want int64
	}{{a, 1000, 61_000}, {a, 60_999, 61_000}, {a, 61_000, 0}, {b, 1000, 0}} {
		if got := c.DeniedUntil(tc.owner, tc.now); got != tc.want {
			t.Errorf("DeniedUntil at %d: %d, want %d", tc.now, got, tc.want)
		}
	}
}

// TakeEnded hands back an ended lease's leftovers once, and nothing of a
// live lease, of another bucket's, or of what a Take handed back already.
func TestTakeEnded(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	a, b := c.Bucket("user:a", "GET", "/x"), c.Bucket("user:b", "GET", "/x")
	c.Put(Entry{Owner: a, Tokens: 5, ExpiresMs: 2000, LeasedAt: 77, Limit: 10, Remaining: 5}, 0)
	if _, out, _ := c.Take(a, 1000); out != Hit {
		t.Fatal("a live lease must hit")
	}
	if e, n := c.TakeEnded(a, 1999); n != 0 || e != (Entry{}) {
		t.Fatalf("a live lease gave %d, %+v", n, e)
	}
	if _, n := c.TakeEnded(b, 3000); n != 0 {
		t.Fatalf("another bucket gave %d", n)
	}
	e, n := c.TakeEnded(a, 2000)
	if n != 4 || e.Spent != 1 || e.LeasedAt != 77 {
		t.Fatalf("the ended lease gave %d, %+v; want its 4 tokens left, 1 spent, leased_at 77", n, e)
	}
	if _, n := c.TakeEnded(a, 3000); n != 0 {
		t.Fatalf("a second TakeEnded gave %d", n)
	}
	if _, out, returned := c.Take(a, 3000); out != Miss || returned != 0 {
		t.Fatalf("a Take after TakeEnded: %v, %d handed back again", out, returned)
	}
	// And what a Take handed back is not handed back again.
	c.Put(Entry{Owner: b, Tokens: 3, ExpiresMs: 2000, Limit: 10, Remaining: 5}, 0)
	if _, out, returned := c.Take(b, 2500); out != Miss || returned != 3 {
		t.Fatalf("Take of an ended lease: %v, %d", out, returned)
	}
	if _, n := c.TakeEnded(b, 2500); n != 0 {
		t.Fatalf("TakeEnded after a Take gave %d", n)
	}
}

func TestTakeLifecycle(t *testing.T) {
	s := newMemStore()
	c := newCache(t, s, 8)
	a := c.Bucket("user:a", "GET", "/x")
	if _, out, _ := c.Take(a, 1000); out != Miss {
		t.Fatal("empty cache must miss")
	}
	c.Put(Entry{Owner: a, Tokens: 2, ExpiresMs: 2000, Limit: 10, Remaining: 5, RuleID: "r", Identity: "user:a", Tier: "free"}, 0)
	for i := 0; i < 2; i++ {
		e, out, _ := c.Take(a, 1500)
		if out != Hit || e.Identity != "user:a" || e.Tier != "free" || e.RuleID != "r" || e.Limit != 10 || e.Tokens != int64(1-i) {
			t.Fatalf("take %d: %v %+v", i, out, e)
		}
		// Take rewrites only the count in place: the slot still decodes
		// whole.
		data, _, _ := s.Get(firstWay(c, a))
		if stored, ok := decode(data, true); !ok || stored != e {
			t.Fatalf("take %d left %+v in the slot, returned %+v", i, stored, e)
		}
	}
	if _, out, left := c.Take(a, 1500); out != Miss || left != 0 {
		t.Fatalf("spent lease: %v %d", out, left)
	}
	c.Put(Entry{Owner: a, Tokens: 3, ExpiresMs: 2000}, 0)
	if _, out, left := c.Take(a, 2500); out != Miss || left != 3 {
		t.Fatalf("expired lease: %v, returned %d; want a miss handing back 3", out, left)
	}
	if _, _, left := c.Take(a, 2500); left != 0 {
		t.Fatal("expired tokens were handed back twice")
	}
	// The tokens go back with the lease's leased_at, whenever (whether a
	// window still counts them is Redis's to say, by its clock); what was
	// spent is reported with them.
	w := c.Bucket("user:w", "GET", "/x")
	c.Put(Entry{Owner: w, Tokens: 3, ExpiresMs: 2000, ResetAt: 3, LeasedAt: 1_795_676_400_000}, 0)
	if _, out, _ := c.Take(w, 1500); out != Hit {
		t.Fatalf("a live lease: %v", out)
	}
	if e, out, left := c.Take(w, 1_795_676_500_000); out != Miss || left != 2 || e.Spent != 1 || e.LeasedAt != 1_795_676_400_000 {
		t.Fatalf("an expired lease: %v, returned %d, %+v; want 2 returned with their leased_at, 1 spent", out, left, e)
	}
	// Two leases merged in one slot go back with the earlier stamp (a
	// pool's tokens with theirs): the later would let the earlier
	// window's tokens count in the next.
	for _, tc := range []struct{ first, second, want int64 }{
		{200, 100, 100}, {100, 200, 100}, {0, 100, 0}, {100, 0, 0}, {0, 0, 0},
	} {
		c.Put(Entry{Owner: w, Tokens: 1, ChargeTokens: 2, ExpiresMs: 2000, LeasedAt: tc.first, ChargeLeasedAt: tc.first + 7}, 0)
		c.Put(Entry{Owner: w, Tokens: 1, ChargeTokens: 5, ExpiresMs: 2000, LeasedAt: tc.second, ChargeLeasedAt: tc.second + 7}, 0)
		if e, out, left := c.Take(w, 2000); out != Miss || left != 2 || e.ChargeTokens != 7 || e.LeasedAt != tc.want ||
			e.ChargeLeasedAt != tc.want+7 {
			t.Fatalf("merged %d and %d: %v, returned %d, %+v; want leased_at %d", tc.first, tc.second, out, left, e, tc.want)
		}
	}
	// A denial put over a live lease keeps the lease's leased_at.
	c.Put(Entry{Owner: w, Tokens: 1, ExpiresMs: 2000, LeasedAt: 300}, 0)
	c.Put(Entry{Owner: w, DeniedUntilMs: 1000}, 0)
	if e, _, left := c.Take(w, 2000); left != 1 || e.LeasedAt != 300 {
		t.Fatalf("after a denial: returned %d, leased_at %d; want 1 and 300", left, e.LeasedAt)
	}
	c.Put(Entry{Owner: a, DeniedUntilMs: 3000, RetryAfter: 1, Identity: "user:a"}, 0)
	if e, out, _ := c.Take(a, 2999); out != Denied || e.Identity != "user:a" {
		t.Fatalf("cached denial not honoured: %v %+v", out, e)
	}
	if _, out, _ := c.Take(a, 3000); out != Miss {
		t.Fatal("denial outlived its wait")
	}
}

func TestSlotOwnership(t *testing.T) {
	c := newCache(t, newMemStore(), 1) // every bucket collides
	a, b := c.Bucket("a"), c.Bucket("b")
	c.Put(Entry{Owner: a, Tokens: 5, ExpiresMs: 1 << 40}, 0)
	if _, out, _ := c.Take(b, 0); out != Miss {
		t.Fatal("a bucket spent another bucket's tokens")
	}
}

// Many VMs spending one lease at once never spend more tokens than it held,
// and none is lost: hits plus what is left is the lease.
func TestConcurrentTakesNeverOverspend(t *testing.T) {
	s := newMemStore()
	first := newCache(t, s, 4)
	a := first.Bucket("hot")
	first.Put(Entry{Owner: a, Tokens: 100, ExpiresMs: 1 << 40}, 0)
	var hits atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := New(s, randomBytes, "tg", 4)
			if err != nil {
				t.Error(err)
				return
			}
			for i := 0; i < 50; i++ {
				if _, out, _ := c.Take(a, 0); out == Hit {
					hits.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	data, _, _ := s.Get(firstWay(first, a))
	left, _ := decode(data, false)
	if hits.Load() > 100 || hits.Load()+left.Tokens != 100 {
		t.Fatalf("%d hits and %d left from a lease of 100", hits.Load(), left.Tokens)
	}
}

// Concurrent callouts of one bucket each bring a lease; none is thrown away,
// and the merged tokens expire with the earlier lease.
func TestPutMergesLiveLeases(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	a := c.Bucket("a")
	c.Put(Entry{Owner: a, Tokens: 3, ExpiresMs: 5000}, 1000)
	c.Put(Entry{Owner: a, Tokens: 4, ExpiresMs: 9000, RuleID: "newer"}, 1000)
	hits := 0
	for {
		e, out, _ := c.Take(a, 2000)
		if out != Hit {
			break
		}
		if e.RuleID != "newer" {
			t.Fatal("the newer decision's snapshot was not kept")
		}
		hits++
	}
	if hits != 7 {
		t.Fatalf("%d hits from leases of 3 and 4", hits)
	}
	// An expired lease is not merged into: the new one replaces it.
	c.Put(Entry{Owner: a, Tokens: 5, ExpiresMs: 3000}, 2000)
	c.Put(Entry{Owner: a, Tokens: 2, ExpiresMs: 9000}, 4000)
	hits = 0
	for {
		if _, out, _ := c.Take(a, 6000); out != Hit {
			break
		}
		hits++
	}
	if hits != 2 {
		t.Fatalf("%d hits; want only the 2 tokens of the live lease", hits)
	}
	// Merging never overflows into a negative count.
	c.Put(Entry{Owner: a, Tokens: math.MaxInt64, ExpiresMs: 9000}, 6000)
	c.Put(Entry{Owner: a, Tokens: math.MaxInt64, ExpiresMs: 9000}, 6000)
	if e, out, _ := c.Take(a, 6000); out != Hit || e.Tokens != math.MaxInt64-1 {
		t.Fatalf("merged huge leases: %v, %d tokens", out, e.Tokens)
	}
}

// A denial cached by one callout does not waste tokens another brought.
func TestTokensBeatCachedDenial(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	a := c.Bucket("a")
	c.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: 5000}, 1000)
	c.Put(Entry{Owner: a, DeniedUntilMs: 4000}, 1000)
	if _, out, _ := c.Take(a, 2000); out != Hit {
		t.Fatalf("live token not spent under a cached denial: %v", out)
	}
	if _, out, _ := c.Take(a, 2000); out != Denied {
		t.Fatalf("denial not honoured once the tokens are gone: %v", out)
	}
}

// The owner and slot of a bucket depend on the process's secret key: two
// processes (two random keys) map the same buckets to unrelated slots, so
// nobody can compute from a bucket alone which other bucket shares its slot.
// Parts are length-delimited.
func TestBucketIsKeyed(t *testing.T) {
	s := newMemStore()
	c1, c2 := newCache(t, s, 1024), newCache(t, s, 1024)
	if c1.Bucket("user:a", "GET", "/x") != c2.Bucket("user:a", "GET", "/x") {
		t.Fatal("two VMs of one process disagree on a bucket")
	}
	other := newCache(t, newMemStore(), 1024) // another process, another key
	if c1.Bucket("user:a", "GET", "/x") == other.Bucket("user:a", "GET", "/x") {
		t.Fatal("the owner does not depend on the key")
	}
	// An unkeyed slot function would agree on all 500; two independent
	// keys agree on about 500/1024 of them.
	same := 0
	for i := 0; i < 500; i++ {
		p := strings.Repeat("x", i)
		if firstWay(c1, c1.Bucket("user:a", p)) == firstWay(other, other.Bucket("user:a", p)) {
			same++
		}
	}
	if same > 10 {
		t.Fatalf("%d of 500 buckets in the same slot under two keys", same)
	}
	for _, pair := range [][2][]string{
		{{"ab", "c"}, {"a", "bc"}},
		{{"a\x00", "b"}, {"a", "\x00b"}},
		{{"a"}, {"a", ""}},
		{{""}, {}},
		{{"abcdefgh"}, {"abcdefgh", ""}},
		{{"\x01\x00\x00\x00\x00\x00\x00\x00a"}, {"a", ""}}, // a part that spells a length word
	} {
		if c1.Bucket(pair[0]...) == c1.Bucket(pair[1]...) {
			t.Fatalf("%q and %q are one bucket", pair[0], pair[1])
		}
	}
}

// Every slot is used, whatever the slot count: a bucket's slot must not be
// biased by the owner's marker bit.
func TestSlotsAllUsed(t *testing.T) {
	for _, n := range []uint32{1, 2, 3, 8, 1024} {
		c := newCache(t, newMemStore(), n)
		seen := map[string]bool{}
		for i := 0; i < 20*int(n); i++ {
			seen[firstWay(c, c.Bucket("user:a", strings.Repeat("x", i)))] = true
		}
		if len(seen) < int(n)*9/10 {
			t.Errorf("%d slots: %d used by %d buckets", n, len(seen), 20*n)
		}
	}
}

// VMs starting at once race to create the hash key: the first write wins and
// the others adopt it at once, rather than overwriting it.
func TestKeyCreationRace(t *testing.T) {
	s := newMemStore()
	var winner *Cache
	// The other VM creates its key after this one found none.
	hs := &hookStore{memStore: s, key: "tg.key", onMiss: func() { winner = newCache(t, s, 8) }}
	loser := newCache(t, hs, 8)
	if winner == nil {
		t.Fatal("test setup: the other VM did not run")
	}
	if loser.Bucket("b") != winner.Bucket("b") {
		t.Fatal("the VM that lost the race hashes with another key")
	}
	if again := newCache(t, s, 8); again.Bucket("b") != winner.Bucket("b") {
		t.Fatal("the stored key is not the winner's")
	}
}

// Should two VMs still end up with different keys (a CAS that happened to
// match), they converge on the stored one at the next lease.
func TestKeyRaceConverges(t *testing.T) {
	s := newMemStore()
	c1 := newCache(t, s, 8)
	s.Set("tg.key", make([]byte, keyLen), 0) // another VM's key replaced ours
	c2 := newCache(t, s, 8)
	if c1.Bucket("b") == c2.Bucket("b") {
		t.Fatal("test setup: the keys should differ")
	}
	c1.Put(Entry{Owner: c1.Bucket("b"), Tokens: 3, ExpiresMs: 1 << 40}, 0)
	if c1.Bucket("b") != c2.Bucket("b") {
		t.Fatal("a lease put did not adopt the shared key")
	}
}

// A stored value that is not a key is replaced, not used.
func TestMalformedKeyReplaced(t *testing.T) {
	s := newMemStore()
	s.Set("tg.key", []byte("short"), 0)
	c := newCache(t, s, 8)
	k, _, _ := s.Get("tg.key")
	if len(k) != keyLen {
		t.Fatalf("stored key of %d bytes", len(k))
	}
	if c2 := newCache(t, s, 8); c.Bucket("x") != c2.Bucket("x") {
		t.Fatal("VMs disagree after the key was replaced")
	}
}

// What a Put leaves in a slot that another bucket holds (forced here with one
// slot; with the keyed hash a client cannot aim at a slot at all). A denial
// is what any client can cause at will, so it never takes a slot whose lease
// still has live tokens; a lease may (the lost tokens only under-admit).
func TestPutIntoAnotherBucketsSlot(t *testing.T) {
	const now = 1000
	tests := []struct {
		name       string
		held       Entry // the victim's entry, Owner filled in
		put        Entry // the other bucket's entry
		victimKeep bool  // the victim still owns the slot afterwards
	}{
		{"denial vs live lease", Entry{Tokens: 5, ExpiresMs: 10_000}, Entry{DeniedUntilMs: 60_000}, true},
		{"denial vs live lease under a denial", Entry{Tokens: 1, ExpiresMs: 10_000, DeniedUntilMs: 5000}, Entry{DeniedUntilMs: 60_000}, true},
		{"negative-token denial vs live lease", Entry{Tokens: 5, ExpiresMs: 10_000}, Entry{Tokens: -3, DeniedUntilMs: 60_000}, true},
		{"denial vs expired lease", Entry{Tokens: 5, ExpiresMs: now}, Entry{DeniedUntilMs: 60_000}, false},
		{"denial vs spent lease", Entry{Tokens: 0, ExpiresMs: 10_000}, Entry{DeniedUntilMs: 60_000}, false},
		{"denial vs cached denial", Entry{DeniedUntilMs: 60_000}, Entry{DeniedUntilMs: 60_000}, false},
		{"lease vs live lease", Entry{Tokens: 5, ExpiresMs: 10_000}, Entry{Tokens: 1, ExpiresMs: 10_000}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, newMemStore(), 1)
			victim, other := c.Bucket("user:victim", "/x"), c.Bucket("user:mallory", "/y")
			tt.held.Owner, tt.held.Identity = victim, "user:victim"
			tt.put.Owner, tt.put.Identity = other, "user:mallory"
			if err := c.Put(tt.held, 0); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 10; i++ {
				if err := c.Put(tt.put, now); err != nil {
					t.Fatal(err)
				}
			}
			data, _, _ := c.store.Get(firstWay(c, victim))
			got, _ := decode(data, true)
			if kept := got == tt.held; kept != tt.victimKeep {
				t.Fatalf("victim kept the slot: %v, want %v (slot holds %+v)", kept, tt.victimKeep, got)
			}
		})
	}
}

// The victim's live lease survives any number of denials in its slot, token
// for token; once it is spent the slot is free for anyone's denial.
func TestDenialCannotEvictLiveLease(t *testing.T) {
	c := newCache(t, newMemStore(), 1)
	victim, attacker := c.Bucket("user:victim", "/x"), c.Bucket("user:mallory", "/y")
	c.Put(Entry{Owner: victim, Tokens: 5, ExpiresMs: 10_000, Identity: "user:victim"}, 0)
	for i := 0; i < 5; i++ {
		c.Put(Entry{Owner: attacker, DeniedUntilMs: 60_000, Identity: "user:mallory"}, 1000)
		if e, out, _ := c.Take(victim, 2000); out != Hit || e.Identity != "user:victim" {
			t.Fatalf("victim's token %d: %v", i, out)
		}
	}
	c.Put(Entry{Owner: attacker, DeniedUntilMs: 60_000}, 3000)
	if _, out, _ := c.Take(attacker, 3000); out != Denied {
		t.Fatalf("denial into a free slot: %v", out)
	}
}

// Two VMs find a slot empty at once; one puts a lease, then the other's
// denial lands. The denial must not overwrite the lease it did not see.
func TestDenialIntoEmptySlotRace(t *testing.T) {
	s := newMemStore()
	leaser := newCache(t, s, 1)
	victim := leaser.Bucket("user:victim")
	hs := &hookStore{memStore: s, key: "tg.0", onMiss: func() {
		leaser.Put(Entry{Owner: victim, Tokens: 3, ExpiresMs: 10_000}, 0)
	}}
	denier := newCache(t, hs, 1)
	denier.insertCAS = math.MaxUint32 // deterministic: no real CAS of this store is that high
	if err := denier.Put(Entry{Owner: denier.Bucket("user:mallory"), DeniedUntilMs: 60_000}, 0); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := leaser.Take(victim, 0); out != Hit {
		t.Fatalf("the victim's lease was overwritten by a denial: %v", out)
	}
}

// Long identities are cached whole, and two that differ only past 255 bytes
// are two entries; an entry too large for a slot is refused, not truncated,
// and leaves what the slot held.
func TestLongFieldsAreNeverTruncated(t *testing.T) {
	c := newCache(t, newMemStore(), 1)
	longest := "user:" + strings.Repeat("a", identity.MaxIDLen)
	same300 := strings.Repeat("b", 300)
	for _, id := range []string{longest, "key:" + strings.Repeat("k", identity.MaxIDLen), same300 + "1", same300 + "2", strings.Repeat("m", maxField)} {
		a := c.Bucket(id)
		if err := c.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: 1 << 40, Identity: id, RuleID: id, Tier: id}, 0); err != nil {
			t.Fatalf("%d bytes: %v", len(id), err)
		}
		if e, out, _ := c.Take(a, 0); out != Hit || e.Identity != id || e.RuleID != id || e.Tier != id {
			t.Fatalf("%v, identity of %d bytes back as %d", out, len(id), len(e.Identity))
		}
	}
	held := Entry{Owner: c.Bucket("held"), Tokens: 1, ExpiresMs: 1 << 40, Identity: "user:held"}
	huge := strings.Repeat("z", maxField+1)
	for _, e := range []Entry{
		{Tokens: 1, Identity: huge},
		{Tokens: 1, RuleID: huge},
		{Tokens: 1, Tier: huge},
		{Tokens: 1, CostFrom: huge},
		{Tokens: 1, ChargeRule: huge},
		{DeniedUntilMs: 1 << 40, Identity: huge},
	} {
		c.Put(held, 0)
		e.Owner, e.ExpiresMs = c.Bucket("huge"), 1<<40
		if err := c.Put(e, 0); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("Put of an oversize entry: %v", err)
		}
		if _, out, _ := c.Take(e.Owner, 0); out != Miss {
			t.Fatal("an oversize entry was cached")
		}
		if _, out, _ := c.Take(held.Owner, 0); out != Hit {
			t.Fatal("a refused entry disturbed the slot")
		}
	}
}

// Every slot decode accepts is the encoding of what it decodes to, byte for
// byte, and decoding with or without the strings agrees.
func FuzzDecode(f *testing.F) {
	f.Add(encode(Entry{Owner: Owner{3}, RuleID: "r", Identity: "user:x"}))
	f.Add(encode(Entry{Owner: Owner{1, 2}, Tokens: 5, Identity: "user:" + strings.Repeat("x", 255), Tier: "free"}))
	f.Add(encode(Entry{Identity: strings.Repeat("y", maxField)}))
	f.Add(encode(Entry{Owner: Owner{4}, Tokens: 9, ChargeTokens: 900, ChargeRule: "llm", CostFrom: "response_json:usage.total_tokens", Strategy: "fixed_window", Refusal: `{"status":403}`}))
	f.Add(encode(Entry{Owner: Owner{5}, RefillUntilMs: 1 << 41}))
	f.Add(make([]byte, minLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := decode(b, true)
		if !ok {
			return
		}
		if !bytes.Equal(encode(e), b) {
			t.Fatalf("decoded %+v re-encodes differently", e)
		}
		fixed, ok := decode(b, false)
		fixed.RuleID, fixed.Identity, fixed.Tier, fixed.Strategy, fixed.ChargeRule, fixed.CostFrom, fixed.Refusal = e.RuleID, e.Identity, e.Tier, e.Strategy, e.ChargeRule, e.CostFrom, e.Refusal
		if !ok || fixed != e {
			t.Fatalf("decoding without strings gave %+v, with %+v", fixed, e)
		}
	})
}

// Any entry Put accepts comes back from Take exactly (less the token spent);
// any it refuses leaves nothing behind.
func FuzzPutTake(f *testing.F) {
	f.Add(int64(1), int64(5), int64(7), "r", "user:x", "free")
	f.Add(int64(math.MaxInt64), int64(-1), int64(math.MinInt64), "", strings.Repeat("x", maxField+1), "")
	f.Add(int64(2), int64(3), int64(4), strings.Repeat("r", maxField), strings.Repeat("i", 260), "t")
	f.Fuzz(func(t *testing.T, tokens, limit, resetAt int64, rule, id, tier string) {
		c := newCache(t, newMemStore(), 4)
		e := Entry{Owner: c.Bucket(rule, id, tier), Tokens: tokens, ExpiresMs: 1 << 40, Limit: limit, Remaining: -limit,
			ResetAt: resetAt, WindowSeconds: 60, RetryAfter: 1, RuleID: rule, Identity: id, Tier: tier}
		err := c.Put(e, 0)
		got, out, _ := c.Take(e.Owner, 0)
		if len(rule) > maxField || len(id) > maxField || len(tier) > maxField {
			if !errors.Is(err, ErrTooLarge) || out != Miss {
				t.Fatalf("oversize entry: Put %v, Take %v", err, out)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if tokens <= 0 {
			if out != Miss {
				t.Fatalf("%d tokens gave %v", tokens, out)
			}
			return
		}
		e.Tokens--
		e.Spent++ // a token taken is one more to report
		if out != Hit || got != e {
			t.Fatalf("put %+v, took %v %+v", e, out, got)
		}
	})
}

// Whatever a slot holds (another bucket's entry of any kind, or bytes of no
// layout), MarkRefill leaves another bucket's live tokens and denial alone
// and marks anything else for its bucket, which then finds it Refilling
// until the mark's end.
func FuzzMarkRefill(f *testing.F) {
	f.Add(encode(Entry{Owner: Owner{9}, Tokens: 5, ExpiresMs: 2000}), int64(1000), int64(500))
	f.Add(encode(Entry{Owner: Owner{9}, ChargeTokens: 5, ExpiresMs: 2000}), int64(1000), int64(500))
	f.Add(encode(Entry{Owner: Owner{9}, DeniedUntilMs: 5000, Identity: "user:b"}), int64(1000), int64(500))
	f.Add(encode(Entry{Owner: Owner{9}, Tokens: 5, ExpiresMs: 1000}), int64(1000), int64(0))
	f.Add([]byte("not a slot"), int64(0), int64(1))
	f.Fuzz(func(t *testing.T, slot []byte, nowMs, forMs int64) {
		if forMs < 0 || nowMs < 0 || nowMs > 1<<50 || forMs > 1<<20 {
			return // times as the filter makes them: Unix ms, timeout_ms
		}
		s := newMemStore()
		c := newCache(t, s, 1)
		a := c.Bucket("user:a")
		if err := s.Set(firstWay(c, a), slot, 0); err != nil {
			t.Fatal(err)
		}
		old, ok := decode(slot, false)
		protected := ok && old.Owner != a && (old.DeniedUntilMs > nowMs || (old.Tokens > 0 || old.ChargeTokens > 0) && nowMs < old.ExpiresMs)
		until := nowMs + forMs
		id, marked := c.MarkRefill(a, until, nowMs)
		data, _, _ := s.Get(firstWay(c, a))
		if !marked {
			if !protected || !bytes.Equal(data, slot) {
				t.Fatalf("not marked over %+v (protected %v); the slot changed %v", old, protected, !bytes.Equal(data, slot))
			}
			return
		}
		if protected {
			t.Fatalf("marked over another bucket's live entry %+v", old)
		}
		e, ok := decode(data, true)
		if !ok || e.Owner != a || e.RefillUntilMs != until || e.RefillID != id || e.Tokens != 0 || e.DeniedUntilMs != 0 {
			t.Fatalf("the mark reads %+v (%v)", e, ok)
		}
		want := Miss
		if until > nowMs {
			want = Refilling
		}
		if got, out, _ := c.Take(a, nowMs); out != want || out == Refilling && got.RefillID != id {
			t.Fatalf("Take under the mark: %v %+v, want %v of mark %d", out, got, want, id)
		}
		c.EndRefill(a, id, true)
		if got, out, _ := c.Take(a, nowMs); out != Miss || until > nowMs && got.RefillID != 0 {
			t.Fatalf("Take after the refill ended: %v %+v, want a Miss", out, got)
		}
		c.EndRefill(a, id, false) // ended already: no change
		if next, _ := c.MarkRefill(a, until, nowMs); next == id {
			t.Fatalf("two marks named %d", id)
		}
		c.EndRefill(a, id, false) // an earlier mark than this one: no change
		if _, out, _ := c.Take(a, nowMs); until > nowMs && out != Refilling {
			t.Fatalf("a mark ended by another's id: %v", out)
		}
	})
}

// The hot path of a lease hit: the bucket's owner, then one token taken.
func BenchmarkHit(b *testing.B) {
	c := newCache(b, newMemStore(), 1024)
	parts := [...]string{"ip:203.0.113.5", "", "", "", "GET", "/api/v1/items"}
	b.Run("Bucket", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.Bucket(parts[:]...)
		}
	})
	a := c.Bucket(parts[:]...)
	b.Run("Take", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, out, _ := c.Take(a, 0); out != Hit {
				c.Put(Entry{Owner: a, Tokens: 1 << 20, ExpiresMs: 1 << 40, Limit: 100, RuleID: "r", Identity: "ip:203.0.113.5", Tier: "free"}, 0)
			}
		}
	})
}

// A BucketHasher fed the parts one at a time, as strings or as bytes, gives
// the owner Bucket gives, without allocating.
func TestBucketHasherAgreesWithBucket(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	parts := []string{"ip:203.0.113.5", "", "free", "", "GET", strings.Repeat("/x", 20)}
	want := c.Bucket(parts...)
	b := c.NewBucket()
	for i, p := range parts {
		if i%2 == 0 {
			b.AddBytes([]byte(p))
		} else {
			b.Add(p)
		}
	}
	if got := b.Owner(); got != want {
		t.Fatalf("hasher %x, Bucket %x", got, want)
	}
	buf := []byte(parts[0])
	if n := testing.AllocsPerRun(100, func() {
		b := c.NewBucket()
		b.AddBytes(buf)
		b.Add(parts[5])
		_ = b.Owner()
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// The tokens spent locally are reported once each: the Miss that leads to
// the next callout hands back what was spent since the last one (in its
// Entry's Spent), across VMs and a new lease alike, and another bucket's
// slot reports nothing.
func TestMissReportsSpentOnce(t *testing.T) {
	store := newMemStore()
	c := newCache(t, store, 4)
	other := newCache(t, store, 4) // another VM: the same shared data
	a := c.Bucket("user:a")
	if err := c.Put(Entry{Owner: a, Tokens: 3, ExpiresMs: 10_000, Identity: "user:a"}, 0); err != nil {
		t.Fatal(err)
	}
	for i, cc := range []*Cache{c, other, c} {
		if _, out, _ := cc.Take(a, 100); out != Hit {
			t.Fatalf("take %d: %v", i, out)
		}
	}
	if e, out, left := other.Take(a, 100); out != Miss || left != 0 || e.Spent != 3 {
		t.Fatalf("the lease used up: %v, %d left, %d spent; want a Miss reporting 3", out, left, e.Spent)
	}
	if e, out, _ := c.Take(a, 100); out != Miss || e.Spent != 0 {
		t.Fatalf("reported again: %v %d", out, e.Spent)
	}
	if err := c.Put(Entry{Owner: a, Tokens: 4, ExpiresMs: 20_000, Identity: "user:a"}, 200); err != nil {
		t.Fatal(err)
	}
	c.Take(a, 300)
	// A new lease (or a denial) for the bucket keeps what is still to report.
	if err := c.Put(Entry{Owner: a, Tokens: 2, ExpiresMs: 20_000, Identity: "user:a"}, 400); err != nil {
		t.Fatal(err)
	}
	if e, out, left := c.Take(a, 30_000); out != Miss || left != 5 || e.Spent != 1 {
		t.Fatalf("expired: %v, %d left, %d spent; want 5 handed back and 1 reported", out, left, e.Spent)
	}
	if e, out, _ := c.Take(c.Bucket("user:b"), 100); out != Miss || e.Spent != 0 {
		t.Fatalf("another bucket reported %d", e.Spent)
	}
}

func randomBytes(b []byte) error {
	_, err := rand.Read(b)
	return err
}

// TakeN pays part of a response's cost from a live lease of that rule, and
// only of that rule: never another rule's lease, an expired one, or
// another bucket's; what it takes is reported as spent once.
func TestTakeNChargesTheLease(t *testing.T) {
	c := newCache(t, newMemStore(), 4)
	a, other := c.Bucket("a"), c.Bucket("b")
	lease := Entry{Owner: a, Tokens: 5, ChargeTokens: 100, ExpiresMs: 1000, Remaining: 500, ChargeRule: "llm", CostFrom: "response_header:x-tokens"}
	if err := c.Put(lease, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		owner     Owner
		rule      string
		n, nowMs  int64
		taken     int64
		ok        bool
		remaining int64 // tokens left after
	}{
		{"another bucket", other, "llm", 10, 0, 0, false, 100},
		{"another rule", a, "tier", 10, 0, 0, false, 100},
		{"nothing to take", a, "llm", 0, 0, 0, false, 100},
		{"part of the lease", a, "llm", 30, 0, 30, true, 70},
		{"more than is left", a, "llm", 500, 0, 70, true, 0},
		{"a spent lease", a, "llm", 5, 0, 0, false, 0},
	} {
		taken, e, ok := c.TakeN(tc.owner, tc.rule, tc.n, tc.nowMs)
		if taken != tc.taken || ok != tc.ok || (ok && (e.ChargeTokens != tc.remaining || e.Tokens != 5)) {
			t.Fatalf("%s: took %d ok %v (%d left), want %d %v (%d left)", tc.name, taken, ok, e.ChargeTokens, tc.taken, tc.ok, tc.remaining)
		}
	}
	// Its pool spent, the lease admits no more: the request tokens left go
	// back with the next check.
	if e, out, returned := c.Take(a, 0); out != Miss || returned != 5 || e.Spent != 100 || e.ChargeTokens != 0 {
		t.Fatalf("after the lease was charged: %v, returned %d, spent %d (want 5, 100)", out, returned, e.Spent)
	}
	// The charge's tokens are reported with the next check, once.
	if e, _, _ := c.Take(a, 0); e.Spent != 0 {
		t.Fatalf("spent reported twice: %d", e.Spent)
	}
	lease.Owner = other
	lease.CostFrom = ""
	c.Put(lease, 0)
	if taken, _, ok := c.TakeN(other, "llm", 5, 0); ok || taken != 0 {
		t.Fatal("a lease of a rule without a response cost paid a charge")
	}
	lease.Owner, lease.CostFrom, lease.ExpiresMs = c.Bucket("c"), "response_header:x", 10
	c.Put(lease, 0)
	if taken, _, ok := c.TakeN(lease.Owner, "llm", 5, 10); ok || taken != 0 {
		t.Fatal("an expired lease paid a charge")
	}
}

// A lease of two pools admits a request on a token of each; the pool's
// tokens left go back beside the others, once.
func TestTwoPools(t *testing.T) {
	c := newCache(t, newMemStore(), 4)
	a := c.Bucket("a")
	c.Put(Entry{Owner: a, Tokens: 3, ChargeTokens: 2, ExpiresMs: 1000, ChargeRule: "llm", CostFrom: "response_json:usage.total_tokens"}, 0)
	for i, want := range []Outcome{Hit, Hit, Miss, Miss} {
		e, out, returned := c.Take(a, 0)
		if out != want {
			t.Fatalf("take %d: %v, want %v", i, out, want)
		}
		switch i {
		case 1:
			if e.CostFrom != "response_json:usage.total_tokens" || e.Tokens != 1 || e.ChargeTokens != 0 {
				t.Fatalf("a hit's entry: %+v", e)
			}
		case 2:
			if returned != 1 || e.ChargeTokens != 0 || e.Spent != 2 {
				t.Fatalf("the miss after the pool ran dry: returned %d, %+v", returned, e)
			}
		case 3:
			if returned != 0 || e != (Entry{}) {
				t.Fatalf("handed back twice: %d %+v", returned, e)
			}
		}
	}
	// Expired, both pools go back.
	c.Put(Entry{Owner: a, Tokens: 3, ChargeTokens: 40, ExpiresMs: 1000, ChargeRule: "llm", CostFrom: "response_header:x"}, 0)
	if e, out, returned := c.Take(a, 1000); out != Miss || returned != 3 || e.ChargeTokens != 40 {
		t.Fatalf("expired: %v, returned %d and %d", out, returned, e.ChargeTokens)
	}
	// Merged with a live lease, the pools add up.
	c.Put(Entry{Owner: a, Tokens: 3, ChargeTokens: 40, ExpiresMs: 1000, ChargeRule: "llm", CostFrom: "response_header:x"}, 0)
	c.Put(Entry{Owner: a, Tokens: 2, ChargeTokens: 60, ExpiresMs: 2000, ChargeRule: "llm", CostFrom: "response_header:x"}, 0)
	if e, out, _ := c.Take(a, 0); out != Hit || e.Tokens != 4 || e.ChargeTokens != 99 {
		t.Fatalf("merged: %v %+v", out, e)
	}
	// A decision that brought no lease keeps the live pool's rule: a
	// request admitted on it still reads its response.
	c.Put(Entry{Owner: a, Remaining: 7, RuleID: "tier"}, 0)
	if e, out, _ := c.Take(a, 0); out != Hit || e.CostFrom != "response_header:x" || e.ChargeRule != "llm" || e.Remaining != 7 || e.ChargeTokens != 98 {
		t.Fatalf("after a decision without a lease: %v %+v", out, e)
	}
}

// encode is a slot's bytes for e, in a buffer of its own.
func encode(e Entry) []byte { return encodeInto(nil, &e) }

// A refill in flight on one VM (MarkRefill) makes the bucket's requests on
// another VM wait (Refilling) until the lease it brings is put, the mark is
// ended, or it runs out; a mark never takes a slot from another bucket's
// live lease or denial.
func TestRefillMark(t *testing.T) {
	const now = 10_000
	s := newMemStore()
	vm1, vm2 := newCache(t, s, 1), newCache(t, s, 1) // one slot: every bucket collides
	a, b := vm1.Bucket("user:a", "/x"), vm1.Bucket("user:b", "/y")

	id1, ok := vm1.MarkRefill(a, now+500, now)
	if !ok {
		t.Fatal("an empty slot was not marked")
	}
	if e, out, _ := vm2.Take(a, now+1); out != Refilling || e.RefillID != id1 {
		t.Fatalf("another VM's take during the refill: %v of mark %d, want Refilling of %d", out, e.RefillID, id1)
	}
	if _, out, _ := vm2.Take(b, now+1); out != Miss {
		t.Fatalf("another bucket in the marked slot: %v, want Miss", out)
	}
	if _, out, _ := vm2.Take(a, now+500); out != Miss {
		t.Fatalf("a mark past its end: %v, want Miss", out)
	}
	// The lease the refill brings clears the mark and is spent everywhere.
	if err := vm1.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: now + 1000}, now+2); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := vm2.Take(a, now+3); out != Hit {
		t.Fatalf("after the refill: %v, want Hit", out)
	}
	if _, out, _ := vm2.Take(a, now+3); out != Miss {
		t.Fatalf("the lease spent, no refill marked: %v, want Miss", out)
	}
	// An answer without a lease ends the mark.
	id2, _ := vm1.MarkRefill(a, now+500, now+4)
	// Another VM's refill marked the slot since: ending the first keeps it.
	id3, _ := vm2.MarkRefill(a, now+500, now+4)
	vm1.EndRefill(a, id2, false)
	if e, out, _ := vm2.Take(a, now+5); out != Refilling || e.RefillID != id3 || id3 == id2 || id2 == id1 {
		t.Fatalf("after ending an earlier mark: %v of mark %d, want Refilling of %d (marks %d, %d, %d)", out, e.RefillID, id3, id1, id2, id3)
	}
	vm2.EndRefill(a, id3, false)
	if _, out, _ := vm2.Take(a, now+5); out != Miss {
		t.Fatalf("after EndRefill: %v, want Miss", out)
	}
	id5, _ := vm1.MarkRefill(a, now+500, now+7)
	if pending := vm2.Refills(a, now+7); pending != id5 {
		t.Fatalf("Refills: %d in flight, want %d", pending, id5)
	}
	if pending := vm2.Refills(a, now+500); pending != 0 {
		t.Fatalf("Refills past the mark's end: %d in flight", pending)
	}
	if pending := vm2.Refills(b, now+7); pending != 0 {
		t.Fatalf("Refills of another bucket in the slot: %d", pending)
	}
	// A refill that brought no lease says so to the next refill's
	// requests; a lease put in the slot ends that.
	vm1.EndRefill(a, id5, true)
	id6, _ := vm1.MarkRefill(a, now+500, now+7)
	if e, out, _ := vm2.Take(a, now+7); out != Refilling || e.RefillID != id6 || e.RefillBare != 1 {
		t.Fatalf("after a refill with no lease: %v %+v, want Refilling of %d, bare", out, e, id6)
	}
	vm1.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: now + 1000}, now+8)
	if e, out, _ := vm2.Take(a, now+9); out != Hit || e.RefillBare != 0 {
		t.Fatalf("a lease after a refill with none: %v %+v, want Hit", out, e)
	}

	tests := []struct {
		name   string
		held   Entry // b's entry in the slot
		marked bool
	}{
		{"another bucket's live lease", Entry{Tokens: 5, ExpiresMs: now + 1000}, false},
		{"another bucket's live pool", Entry{ChargeTokens: 5, ExpiresMs: now + 1000}, false},
		{"another bucket's cached denial", Entry{DeniedUntilMs: now + 1000}, false},
		{"another bucket's expired lease", Entry{Tokens: 5, ExpiresMs: now}, true},
		{"another bucket's spent lease", Entry{Tokens: 0, ExpiresMs: now + 1000}, true},
		{"another bucket's ended denial", Entry{DeniedUntilMs: now}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, newMemStore(), 1)
			a, b := c.Bucket("user:a", "/x"), c.Bucket("user:b", "/y")
			tt.held.Owner = b
			if err := c.Put(tt.held, 0); err != nil {
				t.Fatal(err)
			}
			if _, got := c.MarkRefill(a, now+500, now); got != tt.marked {
				t.Fatalf("MarkRefill = %v, want %v", got, tt.marked)
			}
			data, _, _ := c.store.Get(firstWay(c, a))
			e, _ := decode(data, true)
			if owned := e.Owner == a; owned != tt.marked {
				t.Fatalf("a owns the slot: %v, want %v", owned, tt.marked)
			}
			if !tt.marked && e != tt.held {
				t.Fatalf("the slot changed: %+v, want %+v", e, tt.held)
			}
		})
	}
	// Its own slot keeps what it holds: tokens spent by a hit while the
	// mark stands are still reported once.
	c := newCache(t, newMemStore(), 1)
	c.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: now + 1000, Spent: 0}, now)
	c.Take(a, now)
	c.MarkRefill(a, now+500, now)
	if e, out, _ := c.Take(a, now+1); out != Miss || e.Spent != 1 {
		t.Fatalf("the spent token under a mark: %v %+v, want a Miss reporting 1", out, e)
	}
}

// Two buckets that hash to one slot both keep their leases: each may sit
// in either of its two slots (a direct-mapped cache had them evict each
// other's lease on every request). A third evicts one for a lease, never
// for a denial.
func TestTwoWays(t *testing.T) {
	const now = 1000
	c := newCache(t, newMemStore(), 2) // two slots: every bucket's ways are both
	a := c.Bucket("user:a")
	var b, x Owner
	for i := 0; b == (Owner{}) || x == (Owner{}); i++ {
		o := c.Bucket("user:" + strconv.Itoa(i))
		if firstWay(c, o) != firstWay(c, a) || o == a {
			continue
		}
		if b == (Owner{}) {
			b = o
		} else {
			x = o
		}
	}
	lease := func(o Owner) Entry { return Entry{Owner: o, Tokens: 5, ExpiresMs: now + 1000} }
	for _, o := range []Owner{a, b} {
		if err := c.Put(lease(o), now); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		for _, o := range []Owner{a, b} {
			if _, out, _ := c.Take(o, now); out != Hit {
				t.Fatalf("take %d of %x: %v; two buckets of one slot must both keep their lease", i, o[:4], out)
			}
		}
	}
	c.Put(lease(a), now)
	c.Put(lease(b), now)
	// A denial of a third evicts neither.
	c.Put(Entry{Owner: x, DeniedUntilMs: now + 5000}, now)
	for _, o := range []Owner{a, b} {
		if _, out, _ := c.Take(o, now); out != Hit {
			t.Fatalf("%x lost its lease to another's denial: %v", o[:4], out)
		}
	}
	// A lease of the third evicts one of them (its tokens lost: only
	// under-admission), and both that bucket and the third are read where
	// they are.
	c.Put(lease(x), now)
	hits := 0
	for _, o := range []Owner{a, b, x} {
		if _, out, _ := c.Take(o, now); out == Hit {
			hits++
		}
	}
	if hits != 2 {
		t.Fatalf("%d of three buckets in two slots hold a lease, want 2", hits)
	}
	// A spent slot is taken before a live one.
	c = newCache(t, newMemStore(), 2)
	c.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: now + 1000}, now)
	c.Take(a, now) // spent
	c.Put(lease(b), now)
	c.Put(lease(x), now) // must take a's spent slot, not b's lease
	if _, out, _ := c.Take(b, now); out != Hit {
		t.Fatalf("b's lease was evicted while a spent slot was free: %v", out)
	}
}

// firstWay is the first slot of owner's ways (the only one of a cache of
// one slot).
func firstWay(c *Cache, owner Owner) string {
	w, _ := c.ways(owner)
	return w[0]
}
