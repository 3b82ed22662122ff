package memlimit

import (
	"strconv"
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
		{rules.SlidingWindow, 9, 0, 3, 3, 60 * time.Second},
		{rules.SlidingLog, 1, 0, 5, 1, 60 * time.Second}, // never below one
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
