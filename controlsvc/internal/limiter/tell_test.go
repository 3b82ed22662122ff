package limiter

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tollgate-rl/tollgate/shared/breaker"
)

// Tell is the one rule both breakers in front of Redis (the decision API's
// and the gRPC rate limit service's) follow: one cluster node's trouble
// neither opens them nor, met by a probe, keeps them open.
func TestTellSkipsOneNodesTrouble(t *testing.T) {
	down := errors.New("dial tcp 127.0.0.1:7000: connection refused")
	nodeDown := fmt.Errorf("%w (127.0.0.1:7001): i/o timeout", ErrNodeDown)
	// go-redis types a TRYAGAIN reply (errors.As finds it wrapped); a bare
	// one is recognised by its text.
	tryAgain := errors.New("TRYAGAIN Multiple keys request during rehashing of slot")
	for _, tc := range []struct {
		name  string
		err   error
		opens bool
	}{
		{"Redis not answering", down, true},
		{"one node not answering", nodeDown, false},
		{"one node answering OOM", fmt.Errorf("%w (127.0.0.1:7002): OOM command not allowed when used memory > 'maxmemory'", ErrNodeFailing), false},
		{"a slot moving", tryAgain, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := breaker.New(3, 1000)
			for now := range int64(10) {
				Tell(b, tc.err, now)
			}
			if b.Open() != tc.opens {
				t.Fatalf("after 10 failures: open %v, want %v", b.Open(), tc.opens)
			}
		})
	}
	t.Run("a probe that meets one node's trouble", func(t *testing.T) {
		b := breaker.New(3, 1000)
		for now := range int64(3) {
			Tell(b, down, now)
		}
		if !b.Open() || b.Allow(10) {
			t.Fatal("the breaker did not open")
		}
		if ok, probe := b.Admit(2000); !ok || !probe {
			t.Fatalf("after the cooldown: admitted %v, probe %v", ok, probe)
		}
		if Tell(b, nodeDown, 2001) {
			t.Fatal("a node-local answer to the probe changed the breaker")
		}
		// The next call probes at once, and its success closes it.
		if ok, probe := b.Admit(2002); !ok || !probe {
			t.Fatalf("the call after a node-local probe: admitted %v, probe %v", ok, probe)
		}
		if !Tell(b, nil, 2003) || b.Open() {
			t.Fatal("a successful probe did not close the breaker")
		}
	})
}
