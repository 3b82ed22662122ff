package leasecache

import (
	"hash/fnv"
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

func TestTakeLifecycle(t *testing.T) {
	c := New(newMemStore(), "tg", 8)
	a := Bucket("user:a", "GET", "/x")
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
	c := New(newMemStore(), "tg", 1) // every bucket collides
	a, b := Bucket("a"), Bucket("b")
	c.Put(Entry{Owner: a, Tokens: 5, ExpiresMs: 1 << 40}, 0)
	if _, out, _ := c.Take(b, 0); out != Miss {
		t.Fatal("a bucket spent another bucket's tokens")
	}
}

// Many VMs spending one lease at once never spend more tokens than it held.
func TestConcurrentTakesNeverOverspend(t *testing.T) {
	s := newMemStore()
	a := Bucket("hot")
	New(s, "tg", 4).Put(Entry{Owner: a, Tokens: 100, ExpiresMs: 1 << 40}, 0)
	var hits atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := New(s, "tg", 4)
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
	f.Add(encode(Entry{Owner: 3, RuleID: "r", Identity: "user:x"}))
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
	c := New(newMemStore(), "tg", 8)
	a := Bucket("a")
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
	c := New(newMemStore(), "tg", 8)
	a := Bucket("a")
	c.Put(Entry{Owner: a, Tokens: 1, ExpiresMs: 5000}, 1000)
	c.Put(Entry{Owner: a, DeniedUntilMs: 4000}, 1000)
	if _, out, _ := c.Take(a, 2000); out != Hit {
		t.Fatalf("live token not spent under a cached denial: %v", out)
	}
	if _, out, _ := c.Take(a, 2000); out != Denied {
		t.Fatalf("denial not honoured once the tokens are gone: %v", out)
	}
}

func TestBucketIsFNV1a(t *testing.T) {
	h := fnv.New64a()
	h.Write([]byte("user:a\x00GET\x00"))
	if got, want := Bucket("user:a", "GET"), h.Sum64()|1; got != want {
		t.Fatalf("Bucket = %x, want FNV-1a %x", got, want)
	}
	if Bucket("ab", "c") == Bucket("a", "bc") {
		t.Fatal("parts are not separated")
	}
}
