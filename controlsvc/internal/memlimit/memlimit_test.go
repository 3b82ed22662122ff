package memlimit

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func req(alg rules.Algorithm, limit, burst int64, who string) limiter.Request {
	return limiter.Request{Owner: keys.NewOwner("identity", who), Cost: 1,
		Rule: &rules.Rule{ID: "r", Algorithm: alg, Limit: limit, WindowSeconds: 60, Burst: burst, Scope: rules.ScopeIdentity}}
}

// Every algorithm admits its limit divided by the replicas, then refuses,
// and admits again once its time has come.
func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		alg                    rules.Algorithm
		limit, burst, replicas int64
		admitted               int
		refill                 time.Duration // after which one more is admitted
	}{
		{rules.TokenBucket, 10, 0, 1, 10, 6 * time.Second},
		{rules.TokenBucket, 10, 20, 2, 10, 12 * time.Second}, // burst 20 / 2 replicas, refilled at 5 a minute
		{rules.GCRA, 60, 0, 3, 20, 3 * time.Second},
		{rules.FixedWindow, 7, 0, 1, 7, 60 * time.Second},
		{rules.SlidingWindow, 9, 0, 3, 3, 80 * time.Second}, // the previous window weighs 2/3
		{rules.SlidingLog, 1, 0, 5, 1, 120 * time.Second},   // never below one; two windows on
	} {
		t.Run(string(tc.alg)+"/"+strconv.Itoa(int(tc.replicas)), func(t *testing.T) {
			c := &clock{t: time.Unix(1_800_000_000, 0)}
			l := New(tc.replicas, c.now)
			r := req(tc.alg, tc.limit, tc.burst, "a")
			for i := 0; i < tc.admitted; i++ {
				if res := l.Do(r); !res.Allowed {
					t.Fatalf("request %d refused: %+v", i, res)
				}
			}
			res := l.Do(r)
			if res.Allowed || res.RetryAfter <= 0 {
				t.Fatalf("request %d admitted: %+v", tc.admitted, res)
			}
			if other := l.Do(req(tc.alg, tc.limit, tc.burst, "b")); !other.Allowed {
				t.Fatal("another caller shares the counter")
			}
			c.t = c.t.Add(tc.refill)
			if res := l.Do(r); !res.Allowed {
				t.Fatalf("refused after %v: %+v", tc.refill, res)
			}
		})
	}
}

// A flood of new callers keeps at most MaxCounters.
func TestBounded(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	l := New(1, c.now)
	for i := 0; i < MaxCounters+500; i++ {
		l.Do(req(rules.FixedWindow, 5, 0, strconv.Itoa(i)))
	}
	if n := l.Len(); n != MaxCounters {
		t.Fatalf("%d counters kept", n)
	}
}

// A sliding window weighs the previous window's count by its overlap: at
// the window's edge nothing more is admitted, a quarter in a quarter is.
func TestSlidingWindowWeighsThePreviousWindow(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000-1_800_000_000%60, 0)} // a window's start
	l := New(1, c.now)
	r := req(rules.SlidingWindow, 100, 0, "a")
	for i := 0; i < 100; i++ {
		if !l.Do(r).Allowed {
			t.Fatalf("request %d refused", i)
		}
	}
	c.t = c.t.Add(60 * time.Second)
	res := l.Do(r)
	if res.Allowed {
		t.Fatal("admitted at the window's edge with the previous window full")
	}
	if res.RetryAfter <= 0 || res.RetryAfter > time.Second {
		t.Fatalf("retry after %v, want the time the previous window takes to fade by one (0.6 s)", res.RetryAfter)
	}
	c.t = c.t.Add(15 * time.Second)
	admitted := 0
	for l.Do(r).Allowed {
		admitted++
	}
	if admitted != 25 {
		t.Fatalf("a quarter into the window admitted %d, want 25", admitted)
	}
}

// Count counts every hit of the window, refused or not, and starts over in
// the next; Reset forgets a counter.
func TestCountAndReset(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000-1_800_000_000%60+50, 0)}
	l := New(1, c.now)
	for i := int64(1); i <= 3; i++ {
		if h := l.Count("k", 2, 60); h.Count != 2*i || h.ResetSeconds != 10 {
			t.Fatalf("count %d: %+v", i, h)
		}
	}
	if h := l.Count("k", 0, 60); h.Count != 6 {
		t.Fatalf("a read counted: %+v", h)
	}
	c.t = c.t.Add(10 * time.Second)
	if h := l.Count("k", 1, 60); h.Count != 1 {
		t.Fatalf("the next window started at %+v", h)
	}
	r := req(rules.FixedWindow, 1, 0, "a")
	l.Do(r)
	if l.Do(r).Allowed {
		t.Fatal("over the limit")
	}
	if !l.Reset(r.Key()) || l.Reset(r.Key()) {
		t.Fatal("reset did not report the counter once")
	}
	if !l.Do(r).Allowed {
		t.Fatal("refused after a reset")
	}
}

// At the bound, a counter that is whole again goes before one still
// holding a caller's spend, even a less recently used one: a flood of other
// callers does not reset a caller who is out of quota while idle counters
// remain to be forgotten.
func TestEvictionKeepsLiveCounters(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	l := NewSized(1, 100, c.now)
	victim := req(rules.FixedWindow, 1, 0, "victim")
	victim.Rule.WindowSeconds = 3600
	l.Do(victim)
	// 60 callers in a 1 s window, long past by the flood: whole again.
	for i := range 60 {
		r := req(rules.FixedWindow, 5, 0, "old"+strconv.Itoa(i))
		r.Rule.WindowSeconds = 1
		l.Do(r)
	}
	c.t = c.t.Add(10 * time.Second)
	// 90 new callers: the victim is the least recently used, but the whole
	// ones make room.
	for i := range 90 {
		r := req(rules.FixedWindow, 5, 0, "new"+strconv.Itoa(i))
		r.Rule.WindowSeconds = 3600
		l.Do(r)
	}
	if l.Len() != 100 {
		t.Fatalf("%d counters kept, want the bound", l.Len())
	}
	if l.Do(victim).Allowed {
		t.Fatal("the victim's spent counter was forgotten while whole ones were kept")
	}
}

// A long counter name (a client's path) is kept under its digest, counted
// and reset like any other.
func TestLongKeys(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	l := New(1, c.now)
	r := req(rules.FixedWindow, 1, 0, strings.Repeat("p", 5000))
	l.Do(r)
	if l.Do(r).Allowed {
		t.Fatal("a long key was not counted")
	}
	for k := range l.counters {
		if len(k) > 256 {
			t.Fatalf("a key of %d bytes kept", len(k))
		}
	}
	if !l.Reset(r.Key()) || !l.Do(r).Allowed {
		t.Fatal("a long key was not reset")
	}
}

// A charge spends whatever is left, into debt down to minus a hundred
// capacities, as the limiter's scripts do; the caller is refused until it refills.
func TestCharge(t *testing.T) {
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			c := &clock{t: time.Unix(1_800_000_000, 0)}
			l := New(1, c.now)
			r := req(alg, 100, 0, "a")
			if res := l.Do(r); !res.Allowed || res.Remaining != 99 {
				t.Fatalf("admission: %+v", res)
			}
			ch := r
			ch.Charge, ch.Cost = true, 150
			if res := l.Do(ch); !res.Allowed || res.Charged != 150 || res.Remaining != 0 {
				t.Fatalf("charge: %+v, want 150 spent", res)
			}
			if res := l.Do(r); res.Allowed {
				t.Fatalf("admitted in debt: %+v", res)
			}
			// The balance is -51: 9,949 more reach the floor of a hundred
			// capacities, -10,000.
			ch.Cost = 20_000
			if res := l.Do(ch); res.Charged != 9_949 {
				t.Fatalf("charge at the floor: %+v, want 9,949 spent", res)
			}
		})
	}
}

// A counter other callers share goes to minus one window's limit only,
// whatever its burst, as the limiter's scripts (attacks 55 F1, 56 F1, F2).
func TestChargeOfASharedCounter(t *testing.T) {
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		for _, scope := range []rules.Scope{rules.ScopeGlobal, rules.ScopeIP} {
			c := &clock{t: time.Unix(1_800_000_000, 0)}
			l := New(1, c.now)
			r := req(alg, 100, 300, "a")
			r.Rule.Scope = scope
			r.Charge, r.Cost = true, 1_000_000
			if want := r.Rule.Capacity() + 100; l.Do(r).Charged != want {
				t.Errorf("%s, %s: want %d charged (to minus one window's limit)", alg, scope, want)
			}
		}
	}
}

// A refusal in debt names when the caller is admitted again, and not
// before: told this window's end, a caller three windows in debt was
// refused there again.
func TestChargeDebtRetryIsHonest(t *testing.T) {
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		for _, spent := range []int64{250, 400} {
			c := &clock{t: time.Unix(1_800_000_000, 0).Add(7 * time.Second)}
			l := New(1, c.now)
			r := req(alg, 100, 0, "a")
			l.Do(r)
			ch := r
			ch.Charge, ch.Cost = true, spent-1
			l.Do(ch)
			res := l.Do(r)
			if res.Allowed || res.RetryAfter < time.Minute {
				t.Fatalf("%s, %d spent: %+v, want refused for more than a window", alg, spent, res)
			}
			c.t = c.t.Add(res.RetryAfter - 500*time.Millisecond)
			if early := l.Do(r); early.Allowed {
				t.Errorf("%s, %d spent: admitted half a second before the %v it named", alg, spent, res.RetryAfter)
			}
			c.t = c.t.Add(500 * time.Millisecond)
			if late := l.Do(r); !late.Allowed {
				t.Errorf("%s, %d spent: refused at the %v it named: %+v", alg, spent, res.RetryAfter, late)
			}
		}
	}
}

// A charge's debt is paid a window's limit a window, the windows' counters
// carrying it as the scripts do (a window that forgot it at its end gave a
// caller one large completion a window: attack 54 F2).
func TestChargeDebtCarries(t *testing.T) {
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		t.Run(string(alg), func(t *testing.T) {
			c := &clock{t: time.Unix(1_800_000_000, 0)}
			l := New(1, c.now)
			r := req(alg, 100, 0, "a")
			if res := l.Do(r); !res.Allowed {
				t.Fatalf("admission: %+v", res)
			}
			ch := r
			ch.Charge, ch.Cost = true, 399 // 400 spent: three windows past this one's limit
			if res := l.Do(ch); res.Charged != 399 {
				t.Fatalf("charge: %+v", res)
			}
			for w := 1; w <= 2; w++ {
				c.t = c.t.Add(time.Minute)
				if res := l.Do(r); res.Allowed {
					t.Fatalf("%d windows on, with a debt of three: admitted %+v", w, res)
				}
			}
			c.t = c.t.Add(2*time.Minute + time.Second)
			if res := l.Do(r); !res.Allowed {
				t.Fatalf("four windows on, the debt paid: %+v", res)
			}
		})
	}
}

// A reserve is held by an admission and comes back only into the stretch
// it came from: a window's own, a bucket's since it was last full (a
// hand-back on top of a refill the cap cut would be tokens given twice).
func TestReserveComesBackIntoItsStretch(t *testing.T) {
	for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.TokenBucket} {
		t.Run(string(alg), func(t *testing.T) {
			c := &clock{t: time.Unix(1_800_000_000-1_800_000_000%60, 0)}
			l := New(1, c.now)
			admit := req(alg, 100, 0, "ann")
			admit.Cost, admit.Admit, admit.Reserve = 1, 40, 39
			got := l.Do(admit)
			if !got.Allowed || got.Reserved != 39 || got.Remaining != 60 || got.WindowStart <= 0 {
				t.Fatalf("admission: %+v, want 39 held and 60 left", got)
			}
			back := req(alg, 100, 0, "ann")
			back.Cost, back.Returned, back.LeasedAt = 0, 30, got.WindowStart
			if r := l.Do(back); r.Remaining != 90 {
				t.Fatalf("a hand-back of 30 in its stretch: %+v, want 90 left", r)
			}
			// No more than was held comes back.
			if r := l.Do(back); r.Remaining != 99 {
				t.Fatalf("a hand-back past what is held: %+v, want 99 left (9 held)", r)
			}
			got = l.Do(admit) // 59 left, 39 held
			c.t = c.t.Add(time.Minute)
			back.LeasedAt = got.WindowStart
			if r := l.Do(back); r.Remaining != 100 {
				t.Fatalf("a hand-back after its stretch ended: %+v, want the new stretch's 100 only", r)
			}
		})
	}
}
