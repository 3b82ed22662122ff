package leasecache

import "testing"

// Fallback decides from the bucket's last decision, counted in the slot so
// every VM of the proxy spends one count.
func TestFallback(t *testing.T) {
	s := newMemStore()
	// Buckets hash to slots with a key secret per cache: enough slots that
	// the four here share none but once in ten thousand runs (64 slots
	// made one run in ten fail).
	vm1, vm2 := newCache(t, s, 1<<16), newCache(t, s, 1<<16)
	const minute = 60_000
	now := int64(10 * minute) // the start of a window
	premium, atLimit, denied, unknown := vm1.Bucket("user:p"), vm1.Bucket("user:l"), vm1.Bucket("user:d"), vm1.Bucket("user:u")
	put := func(e Entry) {
		if err := vm1.Put(e, now); err != nil {
			t.Fatal(err)
		}
	}
	put(Entry{Owner: premium, Limit: 1000, Remaining: 1000, ResetAt: now/1000 + 60, WindowSeconds: 60, RuleID: "tier_premium", Identity: "user:p"})
	put(Entry{Owner: atLimit, Limit: 1000, Remaining: 0, ResetAt: now/1000 + 30, WindowSeconds: 60})
	put(Entry{Owner: denied, Limit: 10, WindowSeconds: 60, DeniedUntilMs: now + 5000})

	// A high limit keeps being served at its share (a quarter: 250 a
	// minute), the two VMs counting together.
	for i := 0; i < 250; i++ {
		vm := vm1
		if i%2 == 1 {
			vm = vm2
		}
		r := vm.Fallback(premium, now+int64(i), 0.25)
		if !r.Known || !r.Allowed || r.Quota != 250 || r.Entry.Identity != "user:p" {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	if r := vm2.Fallback(premium, now+1000, 0.25); r.Allowed || r.WaitMs != minute-1000 {
		t.Fatalf("the 251st request of the window: %+v", r)
	}
	if r := vm1.Fallback(premium, now+minute, 0.25); !r.Allowed {
		t.Fatalf("the next window: %+v", r)
	}
	// In the window of the last decision, what it left is all there is
	// (a share of it): 40 left, a quarter is 10, until the reset; then a
	// share of the limit again.
	spent := vm1.Bucket("user:s")
	put(Entry{Owner: spent, Limit: 1000, Remaining: 40, ResetAt: now/1000 + 30, WindowSeconds: 60})
	for i := 0; i < 10; i++ {
		if r := vm2.Fallback(spent, now+int64(i), 0.25); !r.Allowed || r.Quota != 10 {
			t.Fatalf("request %d of a window with 40 left: %+v", i, r)
		}
	}
	if r := vm1.Fallback(spent, now+10, 0.25); r.Allowed || r.WaitMs != 30_000-10 {
		t.Fatalf("past what the window left: %+v", r)
	}
	if r := vm1.Fallback(spent, now+30_000, 0.25); !r.Allowed || r.Quota != 250 {
		t.Fatalf("after the reset: %+v", r)
	}
	// A decision whose window is not on the fallback's grid (the service's
	// never are): made 30 s into a grid window, resetting 50 s later, the
	// grid's boundary at 60 s grants nothing again.
	offGrid := vm1.Bucket("user:o")
	put(Entry{Owner: offGrid, Limit: 20, Remaining: 10, ResetAt: now/1000 + 80, WindowSeconds: 60})
	for i := 0; i < 10; i++ {
		if r := vm1.Fallback(offGrid, now+30_000+int64(i), 1); !r.Allowed {
			t.Fatalf("request %d of what the window left: %+v", i, r)
		}
	}
	for _, at := range []int64{30_010, minute - 1, minute + 1, 80_000 - 1} {
		if r := vm2.Fallback(offGrid, now+at, 1); r.Allowed || r.WaitMs != 80_000-at {
			t.Fatalf("at %d ms, before the decision's reset at 80 s: %+v", at, r)
		}
	}
	if r := vm2.Fallback(offGrid, now+80_000, 1); !r.Allowed || r.Quota != 20 {
		t.Fatalf("at the decision's reset: %+v", r)
	}
	// A caller at its limit stays refused until its window resets; one
	// whose denial is cached, until the denial ends.
	if r := vm1.Fallback(atLimit, now, 1); !r.Known || r.Allowed || r.WaitMs != 30_000 {
		t.Fatalf("at its limit: %+v", r)
	}
	if r := vm2.Fallback(atLimit, now+30_000, 1); !r.Allowed {
		t.Fatalf("after its reset: %+v", r)
	}
	if r := vm1.Fallback(denied, now+1000, 1); r.Allowed || r.WaitMs != 4000 {
		t.Fatalf("denied: %+v", r)
	}
	// A caller never seen is not Known: the configured fallback decides.
	if r := vm1.Fallback(unknown, now, 1); r.Known || r.Allowed {
		t.Fatalf("unknown: %+v", r)
	}
	// A share of a small limit is at least one request.
	if got := shareOf(3, 0.1); got != 1 {
		t.Fatalf("shareOf(3, 0.1) = %d", got)
	}
	if got := shareOf(1<<62, 4); got != 1<<63-1 {
		t.Fatalf("shareOf overflow: %d", got)
	}
}
