package filtertest

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// Requests of one bucket that arrive while its refill is in flight wait
// for that answer instead of each calling out: they take from the lease it
// brought, answer from the denial it cached, or call out themselves when
// it brought neither (or failed).
func TestRefillsCoalesce(t *testing.T) {
	ctx := context.Background()
	const config = `{"control_cluster":"controlsvc","lease":{"request":10}}`
	pending := func(e *env) int { return len(e.vms[0].PendingCallouts()) }
	for _, tc := range []struct {
		name      string
		answer    func(e *env)
		followers int // callouts the waiting requests make after the answer
		allowed   bool
	}{
		{"a lease", func(e *env) { e.answer(0, "200", decision(true, 50, 10, 0)) }, 0, true},
		{"a denial", func(e *env) { e.answer(0, "429", decision(false, 0, 0, 30)) }, 0, false},
		{"no lease", func(e *env) { e.answer(0, "200", decision(true, 50, 0, 0)) }, 3, false},
		{"a failure", func(e *env) {
			c, _ := e.callout(0)
			if err := e.vms[0].Fail(ctx, c.Token); err != nil {
				t.Fatal(err)
			}
		}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, config, 1)
			lead, _ := e.start(req{})
			var waiting []*wasmhost.Stream
			for range 3 {
				s, act := e.start(req{})
				if act != wasmhost.Pause {
					t.Fatalf("a request of a bucket being refilled went on: %v", act)
				}
				waiting = append(waiting, s)
			}
			if n := pending(e); n != 1 {
				t.Fatalf("%d callouts for one bucket, want 1", n)
			}
			tc.answer(e)
			if n := pending(e); n != tc.followers {
				t.Fatalf("%d callouts after the answer, want %d", n, tc.followers)
			}
			for i, s := range waiting {
				switch {
				case tc.followers > 0:
					if s.Resumed || s.Local != nil {
						t.Fatalf("waiter %d decided before its own callout", i)
					}
				case tc.allowed && (!s.Resumed || s.RequestHeaders.Value("x-tollgate-decision") != "allowed"):
					t.Fatalf("waiter %d: resumed %v, decision %q", i, s.Resumed, s.RequestHeaders.Value("x-tollgate-decision"))
				case !tc.allowed && (s.Local == nil || s.Local.Status != 429):
					t.Fatalf("waiter %d: %+v, want the cached 429", i, s.Local)
				}
			}
			_ = lead
			if err := e.vms[0].Broken(); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A waiting request whose client went away is skipped.
	e := newEnv(t, config, 1)
	e.start(req{})
	gone, _ := e.start(req{})
	if err := gone.Done(ctx); err != nil {
		t.Fatal(err)
	}
	e.answer(0, "200", decision(true, 50, 10, 0))
	if gone.Resumed || e.vms[0].Broken() != nil {
		t.Fatal("a finished stream was resumed")
	}
}

// Requests of one bucket on another VM, arriving while the first VM's
// refill is in flight, wait for it too (the refill is marked in the
// bucket's slot; their VM's tick looks again every millisecond): one call
// per refill, not one per VM. What they do once it is answered is what
// this VM's own waiters do, and a waiter never queues behind more than one
// callout of another waiter.
func TestRefillsCoalesceAcrossVMs(t *testing.T) {
	ctx := context.Background()
	const config = `{"control_cluster":"controlsvc","lease":{"request":10},"timeout_ms":200}`
	tick := func(t *testing.T, e *env) {
		t.Helper()
		if err := e.vms[1].Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(t *testing.T, e *env, vm int) {
		t.Helper()
		for _, c := range e.vms[vm].PendingCallouts() {
			if err := e.vms[vm].Fail(ctx, c.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		// then answers VM 0's callout (or not) and ticks VM 1; it returns
		// the callouts VM 1 made and whether its waiters are answered.
		then      func(t *testing.T, e *env)
		callouts  int  // VM 1's callouts after then
		decided   bool // VM 1's waiters decided
		allowed   bool
		tickAfter bool // VM 1 still ticks
	}{
		{"a lease", func(t *testing.T, e *env) { e.answer(0, "200", decision(true, 50, 10, 0)); tick(t, e) }, 0, true, true, false},
		{"a denial", func(t *testing.T, e *env) { e.answer(0, "429", decision(false, 0, 0, 30)); tick(t, e) }, 0, true, false, false},
		{"not answered yet", func(t *testing.T, e *env) { tick(t, e); tick(t, e) }, 0, false, false, true},
		// No lease (a counter's first request): one waiter calls out, the
		// others wait for it on their own VM.
		{"no lease", func(t *testing.T, e *env) { e.answer(0, "200", decision(true, 50, 0, 0)); tick(t, e) }, 1, false, false, false},
		{"no lease, then a lease", func(t *testing.T, e *env) {
			e.answer(0, "200", decision(true, 50, 0, 0))
			tick(t, e)
			e.answer(1, "200", decision(true, 49, 10, 0))
		}, 0, true, true, false},
		// The service fails: the waiter that called out fails too, and the
		// rest each call out once, not one after another.
		{"failures", func(t *testing.T, e *env) {
			fail(t, e, 0)
			tick(t, e)
			fail(t, e, 1)
		}, 2, false, false, false},
		// The first VM's callout outlives its mark (timeout_ms): they stop
		// waiting for it.
		{"the mark runs out", func(t *testing.T, e *env) { e.clock.Advance(200 * time.Millisecond); tick(t, e) }, 1, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, config, 2)
			if _, act := e.start(req{vm: 0}); act != wasmhost.Pause {
				t.Fatal("the first request did not call out")
			}
			var waiting []*wasmhost.Stream
			for range 3 {
				s, act := e.start(req{vm: 1})
				if act != wasmhost.Pause {
					t.Fatalf("a request of a bucket being refilled on another VM went on: %v", act)
				}
				waiting = append(waiting, s)
			}
			e.noCallout(1)
			if p := e.vms[1].TickPeriod(); p != time.Millisecond {
				t.Fatalf("the waiting VM ticks every %v, want 1ms", p)
			}
			tc.then(t, e)
			if n := len(e.vms[1].PendingCallouts()); n != tc.callouts {
				t.Fatalf("VM 1 made %d callouts, want %d", n, tc.callouts)
			}
			for i, s := range waiting {
				decided := s.Resumed || s.Local != nil
				switch {
				case tc.decided != decided && (tc.decided || i > 0 || tc.callouts == 0):
					t.Fatalf("waiter %d decided %v, want %v", i, decided, tc.decided)
				case tc.decided && tc.allowed && s.RequestHeaders.Value("x-tollgate-decision") != "allowed":
					t.Fatalf("waiter %d: decision %q", i, s.RequestHeaders.Value("x-tollgate-decision"))
				case tc.decided && !tc.allowed && (s.Local == nil || s.Local.Status != 429):
					t.Fatalf("waiter %d: %+v, want the cached 429", i, s.Local)
				}
			}
			if ticking := e.vms[1].TickPeriod() != 0; ticking != tc.tickAfter {
				t.Fatalf("VM 1 ticking %v, want %v", ticking, tc.tickAfter)
			}
			if err := e.vms[1].Broken(); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A waiter whose client went away is skipped, and the tick stops.
	e := newEnv(t, config, 2)
	e.start(req{vm: 0})
	gone, _ := e.start(req{vm: 1})
	if err := gone.Done(ctx); err != nil {
		t.Fatal(err)
	}
	e.answer(0, "200", decision(true, 50, 10, 0))
	if err := e.vms[1].Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if gone.Resumed || e.vms[1].Broken() != nil || e.vms[1].TickPeriod() != 0 {
		t.Fatalf("a finished stream: resumed %v, tick %v", gone.Resumed, e.vms[1].TickPeriod())
	}
	// The lease it would have taken is still there.
	if _, act := e.start(req{vm: 1}); act != wasmhost.Continue {
		t.Fatal("the refill's lease was spent by a stream that had ended")
	}
}
