package filtertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// Requests of one bucket that arrive while its refill is in flight wait
// for that answer instead of each calling out: they take from the lease it
// brought, answer from the denial it cached, or call out themselves when
// it brought neither or failed: one slow check is not theirs to fail by
// (fail_closed would answer each 503).
func TestRefillsCoalesce(t *testing.T) {
	ctx := context.Background()
	pending := func(e *env) int { return len(e.vms[0].PendingCallouts()) }
	fail := func(e *env) {
		c, _ := e.callout(0)
		if err := e.vms[0].Fail(ctx, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		mode      string
		answer    func(e *env)
		followers int    // callouts the waiting requests make after the answer
		decision  string // what each waiter got: allowed, degraded, a status, or "" (calling out)
	}{
		{"a lease", "fail_open", func(e *env) { e.answer(0, "200", decision(true, 50, 10, 0)) }, 0, "allowed"},
		{"a denial", "fail_open", func(e *env) { e.answer(0, "429", decision(false, 0, 0, 30)) }, 0, "429"},
		{"no lease", "fail_open", func(e *env) { e.answer(0, "200", decision(true, 50, 0, 0)) }, 3, ""},
		{"a failure", "fail_open", fail, 3, ""},
		{"a failure, failing closed, then answers", "fail_closed", func(e *env) {
			fail(e)
			for _, c := range e.vms[0].PendingCallouts() {
				if err := e.vms[0].Respond(ctx, c.Token, wasmhost.CalloutResponse{
					Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(decision(true, 50, 10, 0))}); err != nil {
					t.Fatal(err)
				}
			}
		}, 0, "allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10},"failure_mode":"`+tc.mode+`"}`, 1)
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
			for i, s := range append(waiting, lead) {
				got := outcome(s)
				if want := tc.decision; got != want && s != lead {
					t.Fatalf("request %d: %q, want %q", i, got, want)
				}
			}
			if err := e.vms[0].Broken(); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A waiting request whose client went away is skipped.
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 1)
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
// this VM's own waiters do; a waiter waits for that one refill, never for
// the callouts that follow it (another VM's refill marked next, or a
// fellow waiter's).
func TestRefillsCoalesceAcrossVMs(t *testing.T) {
	ctx := context.Background()
	const config = `{"control_cluster":"controlsvc","lease":{"request":10},"timeout_ms":200}`
	tick := func(t *testing.T, e *env) {
		t.Helper()
		if err := e.vms[1].Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	each := func(t *testing.T, e *env, vm int, resp *wasmhost.CalloutResponse) {
		t.Helper()
		for _, c := range e.vms[vm].PendingCallouts() {
			var err error
			if resp == nil {
				err = e.vms[vm].Fail(ctx, c.Token)
			} else {
				err = e.vms[vm].Respond(ctx, c.Token, *resp)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	callOut := func(t *testing.T, e *env, vm int) {
		t.Helper()
		if _, act := e.start(req{vm: vm}); act != wasmhost.Pause {
			t.Fatalf("VM %d's next request did not call out", vm)
		}
	}
	lease := &wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(decision(true, 49, 10, 0))}
	noLease := &wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(decision(true, 50, 0, 0))}
	for _, tc := range []struct {
		name string
		// then answers VM 0's callout (or not) and ticks VM 1.
		then      func(t *testing.T, e *env)
		callouts  int    // VM 1's callouts pending after then
		decision  string // what each of VM 1's waiters got: allowed, degraded, 429, or "" (still waiting or calling out)
		tickAfter bool   // VM 1 still ticks
	}{
		{"a lease", func(t *testing.T, e *env) { e.answer(0, "200", decision(true, 50, 10, 0)); tick(t, e) }, 0, "allowed", false},
		{"a denial", func(t *testing.T, e *env) { e.answer(0, "429", decision(false, 0, 0, 30)); tick(t, e) }, 0, "429", false},
		{"not answered yet", func(t *testing.T, e *env) { tick(t, e); tick(t, e) }, 0, "", true},
		// No lease (a counter's first request): each waiter calls out
		// itself, rather than wait for another callout.
		{"no lease", func(t *testing.T, e *env) { each(t, e, 0, noLease); tick(t, e) }, 3, "", false},
		// VM 1 kept the leases its own callouts brought: it ticks on, to
		// hand back what they leave once they end (returns.go).
		{"no lease, then leases", func(t *testing.T, e *env) {
			each(t, e, 0, noLease)
			tick(t, e)
			each(t, e, 1, lease)
		}, 0, "allowed", true},
		// Another refill marked the slot after the one they waited for (VM
		// 0's next request, its refill bringing no lease either): they call
		// out rather than wait for that one too.
		{"a second refill marked", func(t *testing.T, e *env) {
			each(t, e, 0, noLease)
			callOut(t, e, 0)
			tick(t, e)
		}, 3, "", false},
		// The refill fails: its waiters on the other VM call out
		// themselves (a slow check is not theirs to fail by), and so do
		// the bucket's next requests, with no refill to wait for, until one
		// brings a lease.
		{"a failure", func(t *testing.T, e *env) { each(t, e, 0, nil); tick(t, e) }, 3, "", false},
		{"a failure, the next refill marked", func(t *testing.T, e *env) {
			each(t, e, 0, nil)
			callOut(t, e, 0)
			tick(t, e)
		}, 3, "", false},
		{"after a failure", func(t *testing.T, e *env) {
			each(t, e, 0, nil)
			tick(t, e)
			callOut(t, e, 1)
		}, 4, "", false},
		{"failures", func(t *testing.T, e *env) {
			each(t, e, 0, nil)
			tick(t, e)
			each(t, e, 1, nil)
		}, 0, "degraded", false},
		// The first VM never answers: at its timeout they stop waiting.
		{"the mark runs out", func(t *testing.T, e *env) { e.clock.Advance(200 * time.Millisecond); tick(t, e) }, 3, "", false},
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
				got := outcome(s)
				if got != tc.decision {
					t.Fatalf("waiter %d: %q, want %q", i, got, tc.decision)
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

// While a bucket's refills bring no lease (the service's enabled = false,
// shadow mode, degraded answers, a counter's first request), its requests
// call out rather than wait for a refill in flight, on any VM: waiting
// would add that refill's round trip to their own (an outsider's attack
// measured 11 ms against 6 with coalescing on). Once a refill brings a
// lease, they wait again.
func TestBareRefillsAreNotWaitedFor(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 2)
	e.start(req{vm: 0})
	e.answer(0, "200", decision(true, 50, 0, 0)) // allowed, no lease
	if _, act := e.start(req{vm: 0}); act != wasmhost.Pause {
		t.Fatal("the next request did not call out")
	}
	for vm := range 2 {
		if _, act := e.start(req{vm: vm}); act != wasmhost.Pause {
			t.Fatalf("VM %d: a request went on", vm)
		}
	}
	if n := len(e.vms[0].PendingCallouts()) + len(e.vms[1].PendingCallouts()); n != 3 {
		t.Fatalf("%d callouts, want 3: none waits for a refill after one that brought no lease", n)
	}
	if w := e.host.Counter("tollgate_refill_waits_total"); w != 0 {
		t.Fatalf("%d requests waited", w)
	}
	// A lease: the bucket's refills are waited for again.
	c := e.vms[0].PendingCallouts()[0]
	if err := e.vms[0].Respond(context.Background(), c.Token, wasmhost.CalloutResponse{
		Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(decision(true, 49, 1, 0))}); err != nil {
		t.Fatal(err)
	}
	e.start(req{vm: 0}) // spends the lease's token
	before := len(e.vms[0].PendingCallouts()) + len(e.vms[1].PendingCallouts())
	if _, act := e.start(req{vm: 0}); act != wasmhost.Pause {
		t.Fatal("a request past the lease went on")
	}
	if _, act := e.start(req{vm: 1}); act != wasmhost.Pause {
		t.Fatal("a request of the other VM went on")
	}
	if n := len(e.vms[0].PendingCallouts()) + len(e.vms[1].PendingCallouts()); n != before+1 {
		t.Fatalf("%d new callouts, want 1: the other VM's request waits for the refill", n-before)
	}
	if w := e.host.Counter("tollgate_refill_waits_total"); w != 1 {
		t.Fatalf("%d requests waited, want 1", w)
	}
}

// outcome is what a paused request got: the status the filter answered, its
// x-tollgate-decision when resumed, or "" while it still waits.
func outcome(s *wasmhost.Stream) string {
	switch {
	case s.Local != nil:
		return fmt.Sprint(s.Local.Status)
	case s.Resumed:
		return s.RequestHeaders.Value("x-tollgate-decision")
	}
	return ""
}
