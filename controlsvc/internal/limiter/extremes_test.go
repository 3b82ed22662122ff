package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// No value the configuration and the decision API accept makes a script
// fail: every algorithm, at every corner of the accepted ranges (limit,
// window, burst, cost, lease, refund, penalties at their largest), admits,
// refuses and reads back without a Redis error, and answers numbers a
// client can use (no negative or overflowed times). A script error would
// count as Redis failing and switch limiting off for everyone.
func TestEveryScriptInputInRangeRuns(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	const maxQ = rules.MaxQuantity
	pen := &Penalty{Window: 24 * time.Hour, Threshold: 1, Multipliers: []int64{1000}}
	n := 0
	for _, a := range rules.Algorithms {
		for _, limit := range []int64{1, 7, maxQ} {
			for _, window := range []int64{rules.MinWindowSeconds, rules.MaxWindowSeconds} {
				for _, burst := range []int64{0, 1, maxQ} {
					rule := &rules.Rule{ID: "x", Algorithm: a, Limit: limit, WindowSeconds: window, Burst: burst, PerEndpoint: true}
					for _, cost := range []int64{1, rule.Capacity()} {
						for _, p := range []*Penalty{nil, pen} {
							n++
							r := Request{Owner: keys.NewOwner("user", fmt.Sprint("extreme-", n)), Rule: rule, Endpoint: "/x", Cost: cost,
								Lease: 1_000_000_000, LeaseFraction: 1, Penalty: p}
							for i, step := range []func(*Request){
								func(*Request) {}, // admit, lease all it may
								func(r *Request) { r.Returned = 1_000_000_000 },              // refund more than leased
								func(r *Request) { r.Returned, r.Cost = 0, rule.Capacity() }, // spend everything
								func(*Request) {}, // refused (penalised)
								func(r *Request) { r.Peek, r.Cost = true, 0 }, // status
							} {
								step(&r)
								res, err := l.Do(ctx, r)
								if err != nil {
									t.Fatalf("%s limit %d window %d burst %d cost %d penalty %v, step %d: %v", a, limit, window, burst, cost, p != nil, i, err)
								}
								if res.Remaining < 0 || res.ResetAfter < 0 || res.RetryAfter < 0 || res.Granted < 0 || res.Credited < 0 {
									t.Fatalf("%s limit %d window %d burst %d cost %d step %d: %+v", a, limit, window, burst, cost, i, res)
								}
							}
						}
					}
				}
			}
		}
	}
	// Every key the scripts wrote expires.
	for _, k := range rdb.Keys(ctx, "*").Val() {
		// -2 is a key that expired since KEYS listed it (a loaded
		// machine); -1 is one without a TTL, which must never be.
		if ttl := rdb.PTTL(ctx, k).Val(); ttl == -1 || ttl < -2 {
			t.Errorf("%s has no TTL (%v)", k, ttl)
		}
	}
}

// A script's own error (here: a counter whose stored state is damaged) is
// ErrScript, told apart from Redis being unreachable.
func TestScriptErrorsAreToldFromOutages(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r := req(rules.TokenBucket, "damaged", 10, 60)
	if err := rdb.Set(ctx, r.Key(), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Do(ctx, r); !errors.Is(err, ErrScript) {
		t.Fatalf("damaged state: %v; want ErrScript", err)
	}
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	ld, err := New(dead)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ld.Close)
	if _, err := ld.Do(ctx, r); err == nil || errors.Is(err, ErrScript) {
		t.Fatalf("unreachable Redis: %v; want an error that is not ErrScript", err)
	}
}
