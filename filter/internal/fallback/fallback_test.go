package fallback

import (
	"math/rand/v2"
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

// model is the limiter spelled out the slow way: callers in a slice, most
// recent last, the first one forgotten when a new caller finds it full.
type model struct {
	limit, windowMs int64
	max             int
	callers         []modelCaller
}

type modelCaller struct {
	name     string
	start, n int64
}

func (m *model) allow(caller string, now int64) (bool, int64) {
	start := now - now%m.windowMs
	c, found := modelCaller{name: caller, start: start}, false
	for i, old := range m.callers {
		if old.name == caller {
			c, found = old, true
			m.callers = append(m.callers[:i], m.callers[i+1:]...)
			break
		}
	}
	if !found && len(m.callers) >= m.max {
		m.callers = m.callers[1:]
	}
	if c.start != start {
		c.start, c.n = start, 0
	}
	ok := c.n < m.limit
	if ok {
		c.n++
	}
	m.callers = append(m.callers, c)
	if !ok {
		return false, c.start + m.windowMs - now
	}
	return true, 0
}

// checkAgainstModel replays ops (a caller number and a time step each) on
// the limiter and the model and fails at the first answer that differs.
func checkAgainstModel(t *testing.T, limit int64, maxCallers int, ops []byte) {
	l := New(limit, 1, maxCallers)
	m := &model{limit: limit, windowMs: 1000, max: maxCallers}
	now := int64(0)
	for i := 0; i+1 < len(ops); i += 2 {
		caller := "c" + strconv.Itoa(int(ops[i]%16))
		now += int64(ops[i+1]) * 7 // steps of up to 1.8 s cross windows
		gotOK, gotWait := l.Allow(caller, now)
		wantOK, wantWait := m.allow(caller, now)
		if gotOK != wantOK || gotWait != wantWait {
			t.Fatalf("op %d (%s at %d): got %v/%d, model %v/%d", i/2, caller, now, gotOK, gotWait, wantOK, wantWait)
		}
		if len(l.counts) > maxCallers {
			t.Fatalf("%d callers tracked, max %d", len(l.counts), maxCallers)
		}
	}
}

func TestMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tt := range []struct {
		limit      int64
		maxCallers int
	}{{1, 1}, {1, 3}, {2, 5}, {3, 16}, {5, 20}} {
		ops := make([]byte, 4000)
		for i := range ops {
			ops[i] = byte(rng.IntN(256))
			if i%2 == 1 && rng.IntN(4) > 0 {
				ops[i] = 0 // mostly the same millisecond, so limits bite
			}
		}
		checkAgainstModel(t, tt.limit, tt.maxCallers, ops)
	}
}

func FuzzAllow(f *testing.F) {
	f.Add(uint8(1), uint8(2), []byte{0, 0, 1, 0, 2, 0, 0, 0, 3, 200, 0, 0})
	f.Fuzz(func(t *testing.T, limit, maxCallers uint8, ops []byte) {
		checkAgainstModel(t, int64(limit%4)+1, int(maxCallers%8)+1, ops)
	})
}

// AllowUpTo bounds one request by its own limit, counted in the caller's
// window with every other: a caller allowed 3 by one request's limit is
// refused by a request under the limiter's own 1.
func TestAllowUpTo(t *testing.T) {
	l := New(1, 60, 8)
	for i, want := range []bool{true, true, true, false} {
		if ok, _ := l.AllowUpTo("a", 1000, 3); ok != want {
			t.Fatalf("request %d under 3: %v", i, ok)
		}
	}
	if ok, wait := l.Allow("a", 2000); ok || wait != 58_000 {
		t.Fatalf("under the limiter's own 1 after 3: %v, wait %d", ok, wait)
	}
	if ok, _ := l.AllowUpTo("a", 60_000, 3); !ok {
		t.Fatal("the next window did not start afresh")
	}
}

// Exhaust leaves a caller nothing until its window ends, and no one else
// less.
func TestExhaust(t *testing.T) {
	l := New(3, 10, 10)
	l.Exhaust("a", 1_000)
	if ok, wait := l.Allow("a", 2_000); ok || wait != 8_000 {
		t.Fatalf("an exhausted caller: %v, wait %d", ok, wait)
	}
	if ok, _ := l.Allow("b", 2_000); !ok {
		t.Fatal("another caller was refused")
	}
	if ok, _ := l.Allow("a", 10_000); !ok {
		t.Fatal("the next window is still exhausted")
	}
}
