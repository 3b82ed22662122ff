package leasecache

import (
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// memStore is shared data as Envoy keeps it: a value and a CAS that changes
// with every write.
type memStore struct {
	mu  sync.Mutex
	m   map[string][]byte
	cas map[string]uint32
}

func newMemStore() *memStore { return &memStore{m: map[string][]byte{}, cas: map[string]uint32{}} }

func (s *memStore) Get(k string) ([]byte, uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[k]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return append([]byte(nil), v...), s.cas[k], nil
}

func (s *memStore) Set(k string, v []byte, cas uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cas != 0 && s.cas[k] != cas {
		return ErrCasMismatch
	}
	s.m[k] = append([]byte(nil), v...)
	s.cas[k]++
	return nil
}

// newCache is a cache over a fresh store.
func newCache(t testing.TB, s Store, slots uint32) *Cache {
	t.Helper()
	c, err := New(s, "tg", slots)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTakeLifecycle(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	a := c.Bucket("user:a", "GET", "/x")
	if _, out, _ := c.Take(a, 1000); out != Miss {
		t.Fatal("empty cache must miss")
	}
	c.Put(Entry{Owner: a, Tokens: 2, ExpiresMs: 2000, Limit: 10, Remaining: 5, RuleID: "r", Identity: "user:a", Tier: "free"}, 0)
	for i := 0; i < 2; i++ {
		e, out, _ := c.Take(a, 1500)
		if out != Hit || e.Identity != "user:a" || e.Tier != "free" || e.RuleID != "r" {
			t.Fatalf("take %d: %v %+v", i, out, e)
		}
	}
	if _, out, left := c.Take(a, 1500); out != Miss || left != 0 {
		t.Fatalf("spent lease: %v %d", out, left)
	}
	c.Put(Entry{Owner: a, Tokens: 3, ExpiresMs: 2000}, 0)
	if _, out, left := c.Take(a, 2500); out != Miss || left != 3 {
		t.Fatalf("expired lease: %v, leftover %d; want a miss handing back 3", out, left)
	}
	if _, _, left := c.Take(a, 2500); left != 0 {
		t.Fatal("expired tokens were handed back twice")
	}
	c.Put(Entry{Owner: a, DeniedUntilMs: 3000, RetryAfter: 1}, 0)
	if _, out, _ := c.Take(a, 2999); out != Denied {
		t.Fatal("cached denial not honoured")
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

// Many VMs spending one lease at once never spend more tokens than it held.
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
			c, err := New(s, "tg", 4)
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
	if hits.Load() > 100 {
		t.Fatalf("%d hits from a lease of 100", hits.Load())
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(Entry{Owner: Owner{3}, RuleID: "r", Identity: "user:x"}))
	f.Add(encode(Entry{Owner: Owner{1, 2}, Tokens: 5, Identity: "user:" + strings.Repeat("x", 255), Tier: "free"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, ok := decode(b); ok {
			if again, ok := decode(encode(e)); !ok || again != e {
				t.Fatalf("round trip of %+v gave %+v", e, again)
			}
		}
	})
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

// The owner of a bucket depends on the process's secret key: a client cannot
// compute which path shares a victim's slot. Parts are length-delimited.
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
	if c1.Bucket("ab", "c") == c1.Bucket("a", "bc") || c1.Bucket("a\x00", "b") == c1.Bucket("a", "\x00b") {
		t.Fatal("parts are not separated")
	}
	// Slots spread (a weak check that the index is not constant).
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		seen[c1.key(c1.Bucket("user:a", strings.Repeat("x", i)))] = true
	}
	if len(seen) < 50 {
		t.Fatalf("100 buckets in %d slots", len(seen))
	}
}

// Two VMs that raced to create the key converge on the stored one at the
// next lease.
func TestKeyRaceConverges(t *testing.T) {
	s := newMemStore()
	c1 := newCache(t, s, 8)
	s.Set("tg.key", make([]byte, 16), 0) // another VM's key replaced ours
	c2 := newCache(t, s, 8)
	if c1.Bucket("b") == c2.Bucket("b") {
		t.Fatal("test setup: the keys should differ")
	}
	c1.Put(Entry{Owner: c1.Bucket("b"), Tokens: 3, ExpiresMs: 1 << 40}, 0)
	if c1.Bucket("b") != c2.Bucket("b") {
		t.Fatal("a lease put did not adopt the shared key")
	}
}

// A crafted request that lands in a victim's slot (forced here with one
// slot) cannot evict the victim's live lease with a denial.
func TestDenialCannotEvictLiveLease(t *testing.T) {
	c := newCache(t, newMemStore(), 1)
	victim, attacker := c.Bucket("user:victim", "/x"), c.Bucket("user:mallory", "/y")
	c.Put(Entry{Owner: victim, Tokens: 5, ExpiresMs: 10_000, Identity: "user:victim"}, 0)
	for i := 0; i < 10; i++ {
		c.Put(Entry{Owner: attacker, DeniedUntilMs: 60_000, Identity: "user:mallory"}, 1000)
	}
	for i := 0; i < 5; i++ {
		if e, out, _ := c.Take(victim, 2000); out != Hit || e.Identity != "user:victim" {
			t.Fatalf("victim's token %d: %v", i, out)
		}
	}
	// Once the lease is spent, the slot is free for anyone's denial.
	c.Put(Entry{Owner: attacker, DeniedUntilMs: 60_000}, 3000)
	if _, out, _ := c.Take(attacker, 3000); out != Denied {
		t.Fatalf("denial into a free slot: %v", out)
	}
}

// Long identities are cached whole, and two that differ only past 255 bytes
// are two entries; an entry too large for a slot is refused, not truncated.
func TestLongIdentitiesAreNeverTruncated(t *testing.T) {
	c := newCache(t, newMemStore(), 8)
	long := "user:" + strings.Repeat("a", 255)
	a := c.Bucket(long)
	if err := c.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: 1 << 40, Identity: long}, 0); err != nil {
		t.Fatal(err)
	}
	if e, out, _ := c.Take(a, 0); out != Hit || e.Identity != long {
		t.Fatalf("%v, identity of %d bytes", out, len(e.Identity))
	}
	huge := Entry{Owner: c.Bucket("x"), Tokens: 1, ExpiresMs: 1 << 40, Identity: strings.Repeat("z", maxField+1)}
	if err := c.Put(huge, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put of an oversize entry: %v", err)
	}
	if _, out, _ := c.Take(huge.Owner, 0); out != Miss {
		t.Fatal("an oversize entry was cached")
	}
}

func TestSipHashVector(t *testing.T) {
	// SipHash-2-4-128 of the empty message under key 00..0f (the authors'
	// reference vector).
	h := newSip(0x0706050403020100, 0x0f0e0d0c0b0a0908)
	h0, h1 := h.sum128()
	var out [16]byte
	binary.LittleEndian.PutUint64(out[:8], h0)
	binary.LittleEndian.PutUint64(out[8:], h1)
	want := [16]byte{0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93}
	if out != want {
		t.Fatalf("%x, want %x", out, want)
	}
	// Fed in any chunking, the same bytes give the same hash.
	msg := "the quick brown fox jumps over the lazy dog"
	whole := newSip(1, 2)
	whole.writeString(msg)
	w0, w1 := whole.sum128()
	for split := 0; split <= len(msg); split++ {
		p := newSip(1, 2)
		p.writeString(msg[:split])
		p.writeString(msg[split:])
		if a, b := p.sum128(); a != w0 || b != w1 {
			t.Fatalf("split at %d changes the hash", split)
		}
	}
}

// The hot path of a lease hit: the bucket's owner, then one token taken.
func BenchmarkHit(b *testing.B) {
	c := newCache(b, newMemStore(), 1024)
	parts := [...]string{"ip:203.0.113.5", "", "", "", "GET", "/api/v1/items"}
	b.Run("Bucket", func(b *testing.B) {
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
