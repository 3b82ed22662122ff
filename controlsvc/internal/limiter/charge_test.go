package limiter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// A charge is a cost known after the response: spent whatever is left,
// taking the balance below zero, never below minus max_debt capacities; the
// caller is refused until the counter refills. Concurrent charges add up
// exactly. Every algorithm that takes charges, with windows long enough
// that nothing refills meanwhile.
func TestCharge(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "charge-"+string(a), 1000, 3600)
			r.Cost = 1
			if res, err := l.Do(ctx, r); err != nil || !res.Allowed || res.Remaining != 999 {
				t.Fatalf("admission: %+v %v", res, err)
			}
			// 40 concurrent charges of 20: exactly 800 spent.
			c := r
			c.Charge, c.Cost = true, 20
			var wg sync.WaitGroup
			var mu sync.Mutex
			var charged int64
			for range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := l.Do(ctx, c)
					if err != nil || !res.Allowed {
						t.Errorf("charge: %+v %v", res, err)
						return
					}
					mu.Lock()
					charged += res.Charged
					mu.Unlock()
				}()
			}
			wg.Wait()
			if charged != 800 {
				t.Fatalf("charged %d, want 800", charged)
			}
			peek := r
			peek.Peek, peek.Cost = true, 0
			if res, err := l.Do(ctx, peek); err != nil || res.Remaining != 199 {
				t.Fatalf("after 801: %+v %v, want 199 left", res, err)
			}
			// A charge past what is left goes below zero: the next
			// admission is refused.
			c.Cost = 700
			if res, err := l.Do(ctx, c); err != nil || res.Charged != 700 || res.Remaining != 0 {
				t.Fatalf("charge into debt: %+v %v", res, err)
			}
			if res, err := l.Do(ctx, r); err != nil || res.Allowed || res.RetryAfter <= 0 {
				t.Fatalf("admission in debt: %+v %v, want refused with a wait", res, err)
			}
			// The debt goes on to minus a hundred capacities, not one: a
			// completion fifty times the budget is charged whole (stopped
			// at minus one, a client asking for one such a window got
			// fifty budgets: attack 54 F2). At -501: 99,499 more fit.
			c.Cost = 100_000
			if res, err := l.Do(ctx, c); err != nil || res.Charged != 99_499 {
				t.Fatalf("charge at the floor: %+v %v, want 99,499 of 100,000 spent (balance -100,000)", res, err)
			}
			if res, err := l.Do(ctx, c); err != nil || res.Charged != 0 {
				t.Fatalf("charge past the floor: %+v %v, want nothing spent", res, err)
			}
		})
	}
}

// A charge's debt is paid as the counter refills, a window's limit a
// window, for every algorithm: a fixed window forgot it when it rolled (one
// large completion a window, each charged the budget once: attack 54 F2).
// The refusal names when the debt is paid, and a request then is admitted;
// half-way there it is refused. Windows of a second, the waits real.
func TestChargeDebtIsPaidWindowByWindow(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			r := req(a, "debt-"+string(a), 10, 1)
			if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
				t.Fatalf("admission: %+v %v", res, err)
			}
			c := r
			c.Charge, c.Cost = true, 39 // 40 spent: three limits past the window's
			if res, err := l.Do(ctx, c); err != nil || res.Charged != 39 {
				t.Fatalf("charge: %+v %v", res, err)
			}
			res, err := l.Do(ctx, r)
			if err != nil || res.Allowed {
				t.Fatalf("in debt: %+v %v, want refused", res, err)
			}
			// Three windows' debt and this window's limit: between three
			// and four seconds from now (the window's own rest, for the
			// window algorithms).
			if res.RetryAfter < 2*time.Second || res.RetryAfter > 4500*time.Millisecond {
				t.Fatalf("in debt of three windows: retry after %v", res.RetryAfter)
			}
			wait := res.RetryAfter
			time.Sleep(wait / 2)
			if res, err := l.Do(ctx, r); err != nil || res.Allowed {
				t.Fatalf("half-way through the debt (%v of %v): %+v %v, want refused", wait/2, wait, res, err)
			}
			time.Sleep(wait - wait/2)
			if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
				t.Fatalf("when the refusal said (%v): %+v %v, want admitted", wait, res, err)
			}
		})
	}
}

// A counter other callers share (a global, endpoint, tenant or address
// budget) goes to minus one window's limit only, whatever its burst: at a
// hundred capacities, one caller's answer of a million tokens refused every
// other caller for a hundred windows (attack 55 F1; every user behind one
// address, attack 56 F2), and at one burst of 3,000 refilled at 100 a
// second, for 30 s (attack 56 F1).
func TestChargeOfASharedCounterStopsAtOneWindow(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		for _, scope := range []rules.Scope{rules.ScopeGlobal, rules.ScopeEndpoint, rules.ScopeTenant, rules.ScopeIP, rules.ScopeUser, rules.ScopeIdentity} {
			r := req(a, "shared-"+string(a)+string(scope), 1000, 3600)
			rule := *r.Rule
			r.Rule = &rule
			r.Rule.Scope, r.Rule.Burst = scope, 3000
			capacity := r.Rule.Capacity() // 3,000 for a bucket, the limit for a window
			c := r
			c.Charge, c.Cost = true, 1_000_000
			want := capacity + 1000 // to minus one window's limit
			if !ManyCallers(scope) {
				want = 101 * capacity // to minus a hundred capacities
			}
			if res, err := l.Do(ctx, c); err != nil || res.Charged != want {
				t.Errorf("%s, %s: %+v %v, want %d charged", a, scope, res, err, want)
			}
		}
	}
}

// A sliding window in debt names the moment the fading window and the
// carried count leave room, not a whole window later: with 25 spent of
// 10, the window after next, 0.6 of the way in (counted by whole windows
// of debt it said 3 windows on, 0.4 of a window late: attack 55, Info).
func TestSlidingWindowDebtRetryIsExact(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	r := req(rules.SlidingWindow, "debt-exact", 10, 1)
	if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
		t.Fatalf("admission: %+v %v", res, err)
	}
	c := r
	c.Charge, c.Cost = true, 24
	if res, err := l.Do(ctx, c); err != nil || res.Charged != 24 {
		t.Fatalf("charge: %+v %v", res, err)
	}
	res, err := l.Do(ctx, r)
	if err != nil || res.Allowed {
		t.Fatalf("in debt: %+v %v", res, err)
	}
	// ResetAfter is this window's rest; the wait past it is 1.6 windows.
	if past := res.RetryAfter - res.ResetAfter; past < 1500*time.Millisecond || past > 1700*time.Millisecond {
		t.Fatalf("retry after %v, %v past this window's end; want 1.6 s past it", res.RetryAfter, past)
	}
	time.Sleep(res.RetryAfter)
	if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
		t.Fatalf("when the refusal said: %+v %v, want admitted", res, err)
	}
}

func TestChargeRefusesWhatItCannotTake(t *testing.T) {
	l, _ := newLimiter(t)
	for name, mod := range map[string]func(*Request){
		"sliding log": func(r *Request) { r.Rule.Algorithm = rules.SlidingLog },
		"lease":       func(r *Request) { r.Lease = 5 },
		"refund":      func(r *Request) { r.Returned = 5 },
		"peek":        func(r *Request) { r.Peek = true },
		"penalty":     func(r *Request) { r.Penalty = &Penalty{Threshold: 1} },
	} {
		r := req(rules.FixedWindow, "charge-bad", 10, 60)
		rule := *r.Rule
		r.Rule = &rule
		r.Charge, r.Cost = true, 3
		mod(&r)
		if _, err := l.Do(context.Background(), r); err == nil {
			t.Errorf("%s: a charge with it was run", name)
		}
	}
}

// Admit: what must be left to pass (an estimate), while the request
// spends its cost.
func TestAdmit(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range []rules.Algorithm{rules.FixedWindow, rules.SlidingWindow, rules.TokenBucket, rules.GCRA} {
		r := req(a, "admit-"+string(a), 100, 3600)
		r.Admit = 100
		if res, err := l.Do(ctx, r); err != nil || !res.Allowed || res.Remaining != 99 {
			t.Fatalf("%s: %+v %v, want admitted spending 1", a, res, err)
		}
		if res, err := l.Do(ctx, r); err != nil || res.Allowed || res.RetryAfter <= 0 {
			t.Fatalf("%s: %+v %v, want refused with 99 left of the 100 needed", a, res, err)
		}
		r.Admit = 99
		if res, err := l.Do(ctx, r); err != nil || !res.Allowed || res.Remaining != 98 {
			t.Fatalf("%s: %+v %v", a, res, err)
		}
	}
}
