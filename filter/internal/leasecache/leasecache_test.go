package leasecache

import (
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
	c.Put(Entry{Owner: a, Tokens: 2, ExpiresMs: 2000, Limit: 10, Remaining: 5, RuleID: "r", Identity: "user:a", Tier: "free"})
	for i := 0; i < 2; i++ {
		e, out, _ := c.Take(a, 1500)
		if out != Hit || e.Identity != "user:a" || e.Tier != "free" || e.RuleID != "r" {
			t.Fatalf("take %d: %v %+v", i, out, e)
		}
	}
	if _, out, left := c.Take(a, 1500); out != Miss || left != 0 {
		t.Fatalf("spent lease: %v %d", out, left)
	}
	c.Put(Entry{Owner: a, Tokens: 3, ExpiresMs: 2000})
	if _, out, left := c.Take(a, 2500); out != Miss || left != 3 {
		t.Fatalf("expired lease: %v, leftover %d; want a miss handing back 3", out, left)
	}
	if _, _, left := c.Take(a, 2500); left != 0 {
		t.Fatal("expired tokens were handed back twice")
	}
	c.Put(Entry{Owner: a, DeniedUntilMs: 3000, RetryAfter: 1})
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
	c.Put(Entry{Owner: a, Tokens: 5, ExpiresMs: 1 << 40})
	if _, out, _ := c.Take(b, 0); out != Miss {
		t.Fatal("a bucket spent another bucket's tokens")
	}
}

// Many VMs spending one lease at once never spend more tokens than it held.
func TestConcurrentTakesNeverOverspend(t *testing.T) {
	s := newMemStore()
	a := Bucket("hot")
	New(s, "tg", 4).Put(Entry{Owner: a, Tokens: 100, ExpiresMs: 1 << 40})
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
