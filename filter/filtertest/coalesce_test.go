package filtertest

import (
	"context"
	"testing"

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
