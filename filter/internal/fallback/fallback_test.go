package fallback

import (
	"strconv"
	"testing"
)

func TestAllow(t *testing.T) {
	l := New(2, 1, 2)
	for i, want := range []bool{true, true, false} {
		if ok, _ := l.Allow("a", 100); ok != want {
			t.Fatalf("request %d: %v", i, ok)
		}
	}
	if ok, wait := l.Allow("a", 900); ok || wait != 100 {
		t.Fatalf("wait %d, want 100", wait)
	}
	if ok, _ := l.Allow("a", 1000); !ok {
		t.Fatal("new window denied")
	}
}

// A full limiter forgets the least recently seen caller only: a flood of new
// callers cannot reset a limited caller's window.
func TestEvictsLeastRecentlyUsed(t *testing.T) {
	l := New(1, 60, 3)
	l.Allow("hot", 0) // spends hot's one request
	for i := 0; i < 100; i++ {
		if ok, _ := l.Allow("hot", 1); ok {
			t.Fatalf("round %d: hot was forgotten and got a fresh window", i)
		}
		l.Allow("new-"+strconv.Itoa(i), 1) // pushes out the oldest newcomer
		if len(l.counts) > 3 {
			t.Fatalf("%d callers tracked, max 3", len(l.counts))
		}
	}
	// The least recently seen is the one that goes.
	l = New(5, 60, 2)
	l.Allow("a", 0)
	l.Allow("b", 0)
	l.Allow("a", 0) // a is now more recent than b
	l.Allow("c", 0) // evicts b
	if _, ok := l.counts["b"]; ok {
		t.Fatal("b should have been evicted")
	}
	if _, ok := l.counts["a"]; !ok {
		t.Fatal("a, seen recently, was evicted")
	}
}

func TestSingleCaller(t *testing.T) {
	l := New(1, 1, 1)
	for i := 0; i < 5; i++ {
		l.Allow("x"+strconv.Itoa(i), 0)
		if len(l.counts) != 1 || l.head == nil || l.head.next != l.head {
			t.Fatalf("ring of one broken after %d", i)
		}
	}
}
