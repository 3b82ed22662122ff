package limiter

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

func newLimiter(t testing.TB) (*Limiter, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb)
	if err == nil {
		t.Cleanup(l.Close)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l, rdb
}

func req(a rules.Algorithm, subject string, limit, window int64) Request {
	return Request{
		Owner: keys.NewOwner("user", subject),
		Rule:  &rules.Rule{ID: "r", Algorithm: a, Limit: limit, WindowSeconds: window},
		Cost:  1,
	}
}

// TestExactUnderConcurrency is the core promise: 200 concurrent checks against
// a limit of 100 admit exactly 100, for every algorithm.
func TestExactUnderConcurrency(t *testing.T) {
	l, _ := newLimiter(t)
	for _, a := range rules.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			// An hour-long window: no refill can sneak in during the test.
			r := req(a, "concurrent-"+string(a), 100, 3600)
			var allowed, denied atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan error, 200)
			for i := 0; i < 200; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, err := l.Do(context.Background(), r)
					if err != nil {
						errs <- err
						return
					}
					if res.Allowed {
						allowed.Add(1)
					} else {
						denied.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if allowed.Load() != 100 || denied.Load() != 100 {
				t.Fatalf("allowed %d, denied %d; want exactly 100 and 100", allowed.Load(), denied.Load())
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "life-"+string(a), 3, 3600)
			for i := int64(1); i <= 3; i++ {
				res, err := l.Do(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if !res.Allowed || res.Remaining != 3-i || res.RetryAfter != 0 {
					t.Fatalf("request %d: %+v; want allowed with %d remaining", i, res, 3-i)
				}
				if res.ResetAfter <= 0 || res.ResetAfter > time.Hour {
					t.Fatalf("request %d: reset after %v, want within the window", i, res.ResetAfter)
				}
			}
			res, err := l.Do(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			// The sliding window may make a full window wait into the next one.
			if res.Allowed || res.Remaining != 0 || res.RetryAfter <= 0 || res.RetryAfter > 2*time.Hour {
				t.Fatalf("4th request: %+v; want denied with a retry within two windows", res)
			}
			peek := r
			peek.Cost, peek.Peek = 0, true
			res, err = l.Do(ctx, peek)
			if err != nil || res.Remaining != 0 {
				t.Fatalf("peek: %+v, %v; want 0 remaining", res, err)
			}
		})
	}
}

// TestSeed000TokenBucketLifecycle follows seed 000's state machine: a new
// bucket starts full, requests spend it, an empty bucket denies with the wait
// for one token, time refills it (never above capacity), and the key expires
// after about twice the refill time.
func TestSeed000TokenBucketLifecycle(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r := req(rules.TokenBucket, "refill", 10, 1) // 10 tokens per second
	for i := 0; i < 10; i++ {
		if res, _ := l.Do(ctx, r); !res.Allowed {
			t.Fatalf("request %d denied", i)
		}
	}
	res, _ := l.Do(ctx, r)
	if res.Allowed || res.RetryAfter > 100*time.Millisecond {
		t.Fatalf("11th: %+v; want denied, retry within one token's refill (100ms)", res)
	}
	// Move the bucket's last refill one second into the past instead of
	// sleeping: the script must refill to capacity, not beyond.
	st := state(t, rdb, r.Key())
	st[1] -= 5000 // tokens, last refill, leased
	setState(t, rdb, r.Key(), st)
	res, _ = l.Do(ctx, r)
	if !res.Allowed || res.Remaining != 9 {
		t.Fatalf("after refill: %+v; want allowed with 9 remaining (capacity 10)", res)
	}
	if ttl := rdb.PTTL(ctx, r.Key()).Val(); ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("TTL %v; want about twice the refill time", ttl)
	}
}

// A lease that is one of several counters' (WarmLeaseOnly) comes only from
// a counter already in use: a path asked for once leases nothing, so its
// tokens never sit unspent while a shared counter runs dry.
func TestWarmLeaseOnly(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "warm-"+string(a), 100, 3600)
			r.Lease, r.LeaseFraction, r.WarmLeaseOnly = 50, 0.1, true
			second := int64(9)
			if a == rules.SlidingLog {
				second = 0 // the log leases nothing (TestSlidingLogLeasesNothing)
			}
			for i, want := range []int64{0, second} {
				res, err := l.Do(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if !res.Allowed || res.Granted != want {
					t.Fatalf("call %d: %+v; want %d granted", i+1, res, want)
				}
			}
		})
	}
}

// The sliding log stamps what it admits when it admits it: leased tokens
// spent up to a lease's TTL later would leave the window that much early
// (an outsider's 30 paths on one counter: 172 admitted in a window of
// 100). It grants none.
func TestSlidingLogLeasesNothing(t *testing.T) {
	l, _ := newLimiter(t)
	r := req(rules.SlidingLog, "log-lease", 100, 3600)
	r.Lease, r.LeaseFraction = 50, 0.5
	for i := 0; i < 3; i++ {
		res, err := l.Do(context.Background(), r)
		if err != nil || !res.Allowed || res.Granted != 0 || res.Remaining != int64(99-i) {
			t.Fatalf("call %d: %+v %v; want no lease, %d remaining", i+1, res, err, 99-i)
		}
	}
}

func TestLease(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		if a == rules.SlidingLog {
			continue // TestSlidingLogLeasesNothing
		}
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "lease-"+string(a), 100, 3600)
			r.Lease, r.LeaseFraction = 50, 0.1
			res, err := l.Do(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			// 99 left after the cost; a tenth of it, floored, is 9.
			if !res.Allowed || res.Granted != 9 || res.Remaining != 90 {
				t.Fatalf("%+v; want 9 granted and 90 remaining", res)
			}
			// Near the limit a lease shrinks to nothing.
			r.Cost = 85
			res, _ = l.Do(ctx, r)
			if !res.Allowed || res.Granted != 0 || res.Remaining != 5 {
				t.Fatalf("near the limit: %+v; want no lease, 5 remaining", res)
			}
			// Handing back leased tokens restores them, never more than leased.
			r.Cost, r.Lease, r.Returned, r.LeasedAt = 0, 0, 100, res.WindowStart
			res, _ = l.Do(ctx, r)
			if res.Remaining != 14 {
				t.Fatalf("after returning: %+v; want the 9 leased tokens back (14 remaining)", res)
			}
		})
	}
}

func TestPenalty(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r := req(rules.FixedWindow, "penalised", 1, 60)
	r.Penalty = &Penalty{Window: time.Hour, Threshold: 2, Multipliers: []int64{1, 4}}
	if res, _ := l.Do(ctx, r); !res.Allowed {
		t.Fatal("first request denied")
	}
	first, _ := l.Do(ctx, r)  // violation 1: below threshold, plain wait
	second, _ := l.Do(ctx, r) // violation 2: threshold, multiplier 1
	third, _ := l.Do(ctx, r)  // blocked? no: multiplier 1 sets no block
	if first.Allowed || second.Allowed || third.Allowed {
		t.Fatal("a request over the limit passed")
	}
	if first.Penalized || second.Penalized || !third.Penalized {
		t.Fatalf("penalized: %v %v %v; want only the third", first.Penalized, second.Penalized, third.Penalized)
	}
	// Violation 3 uses multiplier 4 and sets a block.
	if third.RetryAfter < 3*first.RetryAfter {
		t.Fatalf("third violation waits %v, first %v; want about 4x", third.RetryAfter, first.RetryAfter)
	}
	if ttl := rdb.PTTL(ctx, keys.Block(r.Owner)).Val(); ttl <= 0 {
		t.Fatalf("no block key after a multiplied penalty (ttl %v)", ttl)
	}
	blocked, _ := l.Do(ctx, r)
	if blocked.Allowed || blocked.RetryAfter < 2*first.RetryAfter {
		t.Fatalf("while blocked: %+v", blocked)
	}
	if n := rdb.ZCard(ctx, keys.Penalty(r.Owner)).Val(); n != 3 {
		t.Fatalf("%d violations recorded, want 3 (a blocked request records none)", n)
	}
}

func TestPenaltyLogIsBounded(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r := req(rules.FixedWindow, "flood", 1, 60)
	r.Penalty = &Penalty{Window: time.Hour, Threshold: 1_000_000, Multipliers: []int64{1}}
	for i := 0; i < 1010; i++ {
		if _, err := l.Do(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.ZCard(ctx, keys.Penalty(r.Owner)).Val(); n != 1000 {
		t.Fatalf("%d violations kept, want at most 1000", n)
	}
}

func TestBadRequest(t *testing.T) {
	l, _ := newLimiter(t)
	r := req("leaky_bucket", "x", 1, 1)
	if _, err := l.Do(context.Background(), r); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
	r = req(rules.GCRA, "x", 0, 1)
	if _, err := l.Do(context.Background(), r); err == nil {
		t.Fatal("zero limit accepted")
	}
}

func BenchmarkDo(b *testing.B) {
	l, _ := newLimiter(b)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		b.Run(string(a), func(b *testing.B) {
			r := req(a, "bench", 1_000_000_000, 3600)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Do(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A Redis that lost its script cache (restart, failover, SCRIPT FLUSH) is
// answered by EVAL (EVAL_RO for a read) and the script is cached again, for
// every shape of call: a lone write, a read, a call with the penalty keys,
// a hit count.
func TestScriptFlushFallsBackToEval(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	spend := req(rules.GCRA, "flushed", 10, 60)
	cases := []struct {
		name string
		run  func() error
		want string // the script that must be cached again
		eval string // the command that ran it
	}{
		{"write", func() error {
			res, err := l.Do(ctx, spend)
			if err == nil && (!res.Allowed || res.Remaining != 9) {
				err = fmt.Errorf("%+v, want allowed with 9 left", res)
			}
			return err
		}, l.scripts[rules.GCRA].Hash(), "eval"},
		{"read", func() error {
			r := spend
			r.Peek, r.Cost = true, 0
			res, err := l.Do(ctx, r)
			if err == nil && res.Remaining != 9 {
				err = fmt.Errorf("%+v, want 9 left, as the write left it", res)
			}
			return err
		}, l.scripts[rules.GCRA].Hash(), "eval_ro"},
		{"penalty keys", func() error {
			r := req(rules.TokenBucket, "flushed-penalty", 10, 60)
			r.Penalty = &Penalty{Window: time.Minute, Threshold: 3, Multipliers: []int64{1, 2}}
			res, err := l.Do(ctx, r)
			if err == nil && (!res.Allowed || res.Remaining != 9) {
				err = fmt.Errorf("%+v, want allowed with 9 left", res)
			}
			return err
		}, l.scripts[rules.TokenBucket].Hash(), "eval"},
		{"hit count", func() error {
			h, err := l.Count(ctx, "flushed-count", 2, 60)
			if err == nil && h.Count != 2 {
				err = fmt.Errorf("%+v, want 2 counted", h)
			}
			return err
		}, l.hitCount.Hash(), "eval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.run(); err != nil {
				t.Fatalf("after SCRIPT FLUSH: %v", err)
			}
			stats := rdb.Info(ctx, "commandstats").Val()
			if !strings.Contains(stats, "cmdstat_"+c.eval+":calls=1,") {
				t.Fatalf("the script did not run once as %s:\n%s", strings.ToUpper(c.eval), stats)
			}
			if ok := rdb.ScriptExists(ctx, c.want).Val(); len(ok) != 1 || !ok[0] {
				t.Fatal("the script was not cached again")
			}
		})
	}
}

// Calls that share a pipeline each recover from a flushed script cache, and
// still count exactly: 200 concurrent calls against a limit of 100 right
// after SCRIPT FLUSH admit exactly 100.
func TestBatchedCallsSurviveScriptFlush(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	rdb.ScriptFlush(ctx)
	r := req(rules.TokenBucket, "flushed-batch", 100, 3600)
	var allowed atomic.Int64
	errs := make(chan error, 200)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := l.Do(ctx, r)
			if err != nil {
				errs <- err
				return
			}
			if res.Allowed {
				allowed.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if allowed.Load() != 100 {
		t.Fatalf("allowed %d, want exactly 100", allowed.Load())
	}
}

// However many entries leave the window at once, the next call counts exactly
// what is still inside it (the count never waits for the lazy sweep).
func TestSlidingLogExactAfterMassExpiry(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		entries, aged int64
	}{
		{"all expired", 300, 300},
		{"some expired", 300, 100},
		{"more expired than one sweep", 1000, 999},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := req(rules.SlidingLog, "mass-"+tc.name, tc.entries, 3600)
			for i := int64(0); i < tc.entries; i++ {
				if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
					t.Fatalf("fill %d: %+v %v", i, res, err)
				}
			}
			// Age the oldest entries past the window instead of sleeping.
			old := rdb.ZRangeByScore(ctx, r.Key(), &redis.ZRangeBy{Min: "(0", Max: "+inf", Count: tc.aged}).Val()
			for _, m := range old {
				rdb.ZAdd(ctx, r.Key(), redis.Z{Score: 1, Member: m})
			}
			for i := int64(1); i <= 3; i++ {
				res, err := l.Do(ctx, r)
				if err != nil || !res.Allowed || res.Remaining != tc.aged-i {
					t.Fatalf("call %d after %d of %d expired: %+v %v; want allowed, %d remaining", i, tc.aged, tc.entries, res, err, tc.aged-i)
				}
			}
			if n := rdb.ZCard(ctx, r.Key()).Val(); n > tc.entries-tc.aged+3+2+max(0, tc.aged-3*logSweep) {
				t.Fatalf("%d members left; the sweep should have removed up to %d expired per call", n, logSweep)
			}
		})
	}
}

// A log written by an earlier version (one member per token) keeps counting
// its live weight once, and is rewritten into one entry.
func TestSlidingLogReadsAnOlderLog(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r := req(rules.SlidingLog, "legacy", 10, 3600)
	now := float64(time.Now().UnixMilli())
	for i := 0; i < 4; i++ {
		rdb.ZAdd(ctx, r.Key(), redis.Z{Score: now - float64(i), Member: fmt.Sprintf("%.3f-%d", now, i)})
	}
	res, err := l.Do(ctx, r)
	if err != nil || !res.Allowed || res.Remaining != 5 {
		t.Fatalf("%+v %v; want the 4 old tokens counted (5 remaining)", res, err)
	}
	if n := rdb.ZCard(ctx, r.Key()).Val(); n != 3 {
		t.Fatalf("%d members; want the old log folded into one entry plus the new one and '#c'", n)
	}
}

// A refund gives back at most what is still leased in the counter, however
// much the caller says it returns.
func TestRefundNeverExceedsLeased(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "refund-"+string(a), 100, 3600)
			r.Cost, r.Returned = 10, 1000
			// Nothing was leased: returning 1000 tokens credits nothing.
			if res, err := l.Do(ctx, r); err != nil || res.Remaining != 90 {
				t.Fatalf("refund without a lease: %+v %v; want 90 remaining", res, err)
			}
			if a == rules.SlidingLog {
				return // the log takes no refunds at all
			}
			r.Cost, r.Returned, r.Lease, r.LeaseFraction = 1, 0, 50, 0.1
			res, err := l.Do(ctx, r) // 89 left; a tenth leased
			if err != nil || res.Granted != 8 || res.Remaining != 81 {
				t.Fatalf("lease: %+v %v; want 8 granted, 81 remaining", res, err)
			}
			r.Lease, r.LeasedAt = 0, res.WindowStart
			for i, tc := range []struct{ returned, remaining int64 }{
				{3, 83},   // 3 of 8 back, minus this call's cost
				{100, 87}, // only the 5 still leased
				{100, 86}, // nothing leased any more
			} {
				r.Returned = tc.returned
				if res, err := l.Do(ctx, r); err != nil || res.Remaining != tc.remaining {
					t.Fatalf("refund %d (%d): %+v %v; want %d remaining", i, tc.returned, res, err, tc.remaining)
				}
			}
		})
	}
}

// A denial's wait is the time until the oldest entries that cover what is
// missing have left the window, however many entries that takes: a wait of a
// whole window instead would keep a filter's cached denial (and the caller)
// out far longer than the limit says.
func TestSlidingLogRetryIsExact(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	r := req(rules.SlidingLog, "retry", 1000, 3600)
	for i := 0; i < 1000; i++ {
		if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
			t.Fatalf("fill %d: %+v %v", i, res, err)
		}
	}
	// Spread the entries instead of sleeping: the i-th oldest leaves the
	// window i+1 seconds from now (the scripts' clock is Redis's).
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	nowMs := float64(now.UnixMicro()) / 1000
	entries := rdb.ZRangeByScore(ctx, r.Key(), &redis.ZRangeBy{Min: "(0", Max: "+inf"}).Val()
	for i, m := range entries {
		rdb.ZAdd(ctx, r.Key(), redis.Z{Score: nowMs - 3600_000 + float64(1000*(i+1)), Member: m})
	}
	for _, cost := range []int64{1, 16, 17, 100, 999, 1000} {
		c := r
		c.Cost = cost
		res, err := l.Do(ctx, c)
		if err != nil || res.Allowed {
			t.Fatalf("cost %d: %+v %v; want denied", cost, res, err)
		}
		want := time.Duration(cost) * time.Second
		if res.RetryAfter > want || res.RetryAfter < want-time.Second {
			t.Fatalf("cost %d: retry after %v; want just under %v, when the %d oldest tokens have left", cost, res.RetryAfter, want, cost)
		}
	}
}

// A denial without a refund writes nothing back (the next call computes the
// same from the stored state), and decides the same as one that did; a
// denial that brings a refund writes it.
func TestDenialWritesNothing(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	for _, a := range rules.Algorithms {
		if a == rules.SlidingLog {
			continue // its denials sweep expired entries
		}
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "deny-"+string(a), 5, 3600)
			r.Lease, r.LeaseFraction = 2, 0.5
			res, err := l.Do(ctx, r) // 1 spent, 2 leased
			if err != nil || !res.Allowed || res.Granted != 2 {
				t.Fatalf("lease: %+v %v", res, err)
			}
			r.Lease, r.LeasedAt = 0, res.WindowStart
			for range 2 {
				if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
					t.Fatalf("spend: %+v %v", res, err)
				}
			}
			stored := rdb.Dump(ctx, r.Key()).Val()
			for i := range 3 {
				res, err := l.Do(ctx, r)
				if err != nil || res.Allowed || res.Remaining != 0 || res.RetryAfter <= 0 {
					t.Fatalf("denial %d: %+v %v", i, res, err)
				}
				if now := rdb.Dump(ctx, r.Key()).Val(); now != stored {
					t.Fatalf("denial %d rewrote the state", i)
				}
			}
			r.Returned = 2
			if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
				t.Fatalf("the refund did not make room: %+v %v", res, err)
			}
			r.Returned = 0
			if res, err := l.Do(ctx, r); err != nil || !res.Allowed {
				t.Fatalf("the refund was not written: %+v %v", res, err)
			}
			if res, err := l.Do(ctx, r); err != nil || res.Allowed {
				t.Fatalf("more than the limit: %+v %v", res, err)
			}
		})
	}
}

// state reads a counter's stored numbers: packed little-endian doubles.
func state(t *testing.T, rdb *redis.Client, key string) []float64 {
	t.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	if err != nil || len(b)%8 != 0 {
		t.Fatalf("counter %s: %d bytes, %v", key, len(b), err)
	}
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

// setState writes a counter's numbers back, keeping its TTL.
func setState(t *testing.T, rdb *redis.Client, key string, st []float64) {
	t.Helper()
	b := make([]byte, 0, 8*len(st))
	for _, x := range st {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	if err := rdb.SetArgs(context.Background(), key, b, redis.SetArgs{KeepTTL: true}).Err(); err != nil {
		t.Fatal(err)
	}
}

// A counter an earlier version stored as a hash is read as one and replaced
// by the packed state on the next write: an upgrade neither fails nor resets
// a counter.
func TestHashStateOfEarlierVersionsIsUpgraded(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	for _, tt := range []struct {
		algo   rules.Algorithm
		fields func(nowMs float64, window int64) []any
	}{
		{rules.TokenBucket, func(now float64, _ int64) []any { return []any{"t", "1", "ts", fmt.Sprintf("%.3f", now), "lg", "0"} }},
		{rules.FixedWindow, func(now float64, w int64) []any {
			return []any{"w", fmt.Sprint(int64(now) / (w * 1000)), "c", "9", "lg", "0"}
		}},
		{rules.SlidingWindow, func(now float64, w int64) []any {
			return []any{"w", fmt.Sprint(int64(now) / (w * 1000)), "c", "9", "p", "0", "lg", "0"}
		}},
		{rules.GCRA, func(now float64, w int64) []any {
			// Nine of ten tokens spent: tat is nine intervals ahead.
			return []any{"tat", fmt.Sprintf("%.3f", now+9*float64(w*1000)/10), "lg", "0"}
		}},
	} {
		t.Run(string(tt.algo), func(t *testing.T) {
			r := req(tt.algo, "upgrade-"+string(tt.algo), 10, 3600)
			tm, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(ctx, r.Key(), tt.fields(float64(tm.UnixMicro())/1000, 3600)...).Err(); err != nil {
				t.Fatal(err)
			}
			rdb.Expire(ctx, r.Key(), time.Hour)
			first, err := l.Do(ctx, r)
			if err != nil || !first.Allowed {
				t.Fatalf("first call on the old hash: %+v %v; want allowed (one token left)", first, err)
			}
			if typ := rdb.Type(ctx, r.Key()).Val(); typ != "string" {
				t.Fatalf("after a write the counter is a %s; want the packed string", typ)
			}
			if second, err := l.Do(ctx, r); err != nil || second.Allowed {
				t.Fatalf("second call: %+v %v; want denied: the old count carried over", second, err)
			}
		})
	}
}

// A counter credits a hand-back only into the stretch its lease came from
// (leased_at, a moment inside it): a window into its window, a bucket only
// if it has not been full again since. Tokens of a window that has ended
// came off that window's leases, and credited against the next one's they
// would take from leases other buckets of the same counter were granted
// there (an outsider's LLM pool: 20,600 tokens admitted in a window of
// 15,000); a bucket's, handed back after it was full again, would come on
// top of the refill its cap cut (an outsider: 201 admitted in a burst of
// 100). Without a stamp nothing is credited.
func TestHandBackOnlyInItsWindow(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	redisUs := func() int64 {
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	redisMs := func() int64 { return redisUs() / 1000 }
	awaitRedis := func(ms int64) {
		for i := 0; redisMs() < ms; i++ {
			if i == 1000 {
				t.Fatal("Redis's clock did not get there")
			}
			time.Sleep(5 * time.Millisecond) // the Redis clock is the signal
		}
	}
	for _, a := range rules.Algorithms {
		if a == rules.SlidingLog {
			continue // no leases
		}
		window := a == rules.FixedWindow || a == rules.SlidingWindow
		t.Run(string(a), func(t *testing.T) {
			r := req(a, "leased-at-"+string(a), 100, 3600)
			r.Lease, r.LeaseFraction = 50, 0.1
			res, err := l.Do(ctx, r) // 1 spent, 9 leased
			if err != nil || res.Granted != 9 {
				t.Fatalf("lease: %+v %v", res, err)
			}
			start, end, now := res.WindowStart, res.WindowEnd, redisUs()
			// A window's bounds; a new bucket's stretch from its creation
			// (no lease of a counter of that name before it comes back
			// into it) to when it could be full again (9 + 1 taken at 100
			// an hour: 6 minutes on).
			if window && (start > now || start%3_600_000_000 != 0 || end != start+3_600_000_000) ||
				!window && (start > now || start < now-1_000_000 || end < now+350_000_000 || end > now+370_000_000) {
				t.Fatalf("stretch %d-%d at %d", start, end, now)
			}
			r.Cost, r.Lease = 0, 0
			for _, tc := range []struct {
				name             string
				leasedAt, credit int64
			}{
				{"none", 0, 0},
				{"the stretch before", start - 1, 0},
				{"the next window", start + 3_600_000_000, 0},
				{"this stretch", start, 4},
				{"a moment in this stretch", start + 1234, 4},
			} {
				if !window && tc.name == "the next window" {
					continue // a bucket's stretch has no end until it is full again
				}
				r.Returned, r.LeasedAt = 4, tc.leasedAt
				if res, err := l.Do(ctx, r); err != nil || res.Credited != tc.credit {
					t.Fatalf("%s: %+v %v; want %d credited", tc.name, res, err, tc.credit)
				}
			}
		})
	}

	// One bucket's lease outlives its window, another bucket of the
	// counter is leased in the next, and the first hands back: the new
	// window keeps its count.
	r := req(rules.FixedWindow, "leased-at-across", 100, 1)
	r.Lease, r.LeaseFraction = 50, 0.5
	first, err := l.Do(ctx, r)
	if err != nil || first.Granted == 0 || first.WindowStart == 0 {
		t.Fatalf("first lease: %+v %v", first, err)
	}
	awaitRedis(first.WindowEnd / 1000)
	next, err := l.Do(ctx, r)
	if err != nil || next.Granted == 0 || next.WindowStart <= first.WindowStart {
		t.Fatalf("the next window's lease: %+v %v", next, err)
	}
	r.Cost, r.Lease, r.Returned, r.LeasedAt = 0, 0, first.Granted, first.WindowStart
	if back, err := l.Do(ctx, r); err != nil || back.Credited != 0 || back.Remaining != next.Remaining {
		t.Fatalf("the old window's hand-back: %+v %v; want nothing credited, %d remaining", back, err, next.Remaining)
	}

	// A sliding window's lease handed back in the next window comes off the
	// previous window's count, which still weighs in the sliding estimate
	// (kept, it took 132 of a client's next 200).
	sw := req(rules.SlidingWindow, "leased-at-sliding", 100, 1)
	sw.Lease, sw.LeaseFraction = 50, 0.5
	swLease, err := l.Do(ctx, sw) // 1 spent, 49 leased
	if err != nil || swLease.Granted != 49 {
		t.Fatalf("sliding lease: %+v %v", swLease, err)
	}
	awaitRedis(swLease.WindowEnd / 1000)
	sw.Cost, sw.Lease, sw.Returned, sw.LeasedAt = 0, 0, 49, swLease.WindowStart-1_000_000 // the window before that
	if back, err := l.Do(ctx, sw); err != nil || back.Credited != 0 {
		t.Fatalf("a hand-back of two windows back: %+v %v; want nothing", back, err)
	}
	sw.LeasedAt = swLease.WindowStart
	if back, err := l.Do(ctx, sw); err != nil || back.Credited != 49 {
		t.Fatalf("the previous window's hand-back: %+v %v; want 49 off its count", back, err)
	}

	// A lease of a short window and a long one: past the short one's end
	// the long one still takes its tokens back (one deadline for both, the
	// earlier end, took them from a slow client: 29 admitted of 100).
	short, long := req(rules.FixedWindow, "leased-at-two", 100, 1), req(rules.FixedWindow, "leased-at-two", 100, 3600)
	short.Rule = &rules.Rule{ID: "short", Algorithm: rules.FixedWindow, Limit: 100, WindowSeconds: 1}
	short.Lease, short.LeaseFraction, long.Lease, long.LeaseFraction = 10, 0.5, 10, 0.5
	s1, err1 := l.Do(ctx, short)
	l1, err2 := l.Do(ctx, long)
	if err1 != nil || err2 != nil || s1.Granted != 10 || l1.Granted != 10 {
		t.Fatalf("leases: %+v %v, %+v %v", s1, err1, l1, err2)
	}
	leasedAt := max(s1.WindowStart, l1.WindowStart) // as the service makes it
	awaitRedis(s1.WindowEnd / 1000)
	long.Cost, long.Lease, long.Returned, long.LeasedAt = 0, 0, 10, leasedAt
	short.Cost, short.Lease, short.Returned, short.LeasedAt = 0, 0, 10, leasedAt
	if back, err := l.Do(ctx, long); err != nil || back.Credited != 10 {
		t.Fatalf("the long window's hand-back: %+v %v; want 10 credited", back, err)
	}
	if back, err := l.Do(ctx, short); err != nil || back.Credited != 0 {
		t.Fatalf("the short window's hand-back past its end: %+v %v; want nothing", back, err)
	}

	// Two fast buckets of one chain, asked a millisecond apart, share a
	// moment for the lease's stamp: a bucket's stretch starts when its
	// refill reached capacity, not when a call saw it (starting at the
	// calls, stretches of microseconds did not overlap, the stamp was
	// dropped, and a slow client's window lost every hand-back).
	fast := func(id string) Request {
		return Request{Owner: keys.NewOwner("user", "leased-at-fast"), Cost: 1, Lease: 10, LeaseFraction: 0.5,
			Rule: &rules.Rule{ID: id, Algorithm: rules.TokenBucket, Limit: 1_000_000, WindowSeconds: 1}}
	}
	for _, id := range []string{"a", "b"} { // a state to refill from
		if _, err := l.Do(ctx, fast(id)); err != nil {
			t.Fatal(err)
		}
	}
	awaitRedis(redisMs() + 2) // both full again within microseconds
	fa, errA := l.Do(ctx, fast("a"))
	awaitRedis(redisMs() + 1)
	fb, errB := l.Do(ctx, fast("b"))
	if errA != nil || errB != nil || fa.Granted != 10 || fb.Granted != 10 {
		t.Fatalf("fast leases: %+v %v, %+v %v", fa, errA, fb, errB)
	}
	if at := max(fa.WindowStart, fb.WindowStart); at >= min(fa.WindowEnd, fb.WindowEnd) {
		t.Fatalf("stretches %d-%d and %d-%d share no moment", fa.WindowStart, fa.WindowEnd, fb.WindowStart, fb.WindowEnd)
	}

	// A bucket whose key expired (full long since) starts anew: a lease of
	// the counter before is not credited against the new one's leases.
	for _, a := range []rules.Algorithm{rules.TokenBucket, rules.GCRA} {
		r := req(a, "leased-at-expired-"+string(a), 10, 3600)
		r.Lease, r.LeaseFraction = 50, 0.5
		old, err := l.Do(ctx, r)
		if err != nil || old.Granted != 4 {
			t.Fatalf("%s lease: %+v %v", a, old, err)
		}
		rdb.Del(ctx, r.Key()) // as its TTL would
		now, err := l.Do(ctx, r)
		if err != nil || now.Granted != 4 {
			t.Fatalf("%s the new counter's lease: %+v %v", a, now, err)
		}
		r.Cost, r.Lease, r.Returned, r.LeasedAt = 0, 0, 4, old.WindowStart
		if back, err := l.Do(ctx, r); err != nil || back.Credited != 0 {
			t.Fatalf("%s the old counter's hand-back: %+v %v; want nothing credited", a, back, err)
		}
	}

	// A bucket filled by a hand-back starts a new stretch as by a refill:
	// another lease of before is not credited after it was drained.
	for _, a := range []rules.Algorithm{rules.TokenBucket, rules.GCRA} {
		r := req(a, "leased-at-refunded-full-"+string(a), 10, 1)
		r.Lease, r.LeaseFraction = 50, 0.5
		at := redisMs()
		first, err1 := l.Do(ctx, r)  // 9 left, 4 leased: 5
		second, err2 := l.Do(ctx, r) // 4 left, 2 leased: 2
		if err1 != nil || err2 != nil || first.Granted != 4 || second.Granted != 2 {
			t.Fatalf("%s leases: %+v %v, %+v %v", a, first, err1, second, err2)
		}
		awaitRedis(at + 450) // 4 more at 10 a second: 6, not full
		r.Cost, r.Lease, r.Returned, r.LeasedAt = 0, 0, 4, first.WindowStart
		if back, err := l.Do(ctx, r); err != nil || back.Credited != 4 || back.Remaining != 10 {
			t.Fatalf("%s hand-back that fills it: %+v %v", a, back, err)
		}
		r.Cost, r.Returned, r.LeasedAt = 10, 0, 0
		if drained, err := l.Do(ctx, r); err != nil || !drained.Allowed {
			t.Fatalf("%s drain: %+v %v", a, drained, err)
		}
		r.Cost, r.Returned, r.LeasedAt = 0, 2, second.WindowStart
		if back, err := l.Do(ctx, r); err != nil || back.Credited != 0 {
			t.Fatalf("%s hand-back of a lease from before the fill: %+v %v; want nothing credited", a, back, err)
		}
	}

	// A bucket leased, full again, drained: the lease's tokens do not come
	// back on top.
	for _, a := range []rules.Algorithm{rules.TokenBucket, rules.GCRA} {
		r := req(a, "leased-at-refilled-"+string(a), 10, 1)
		r.Lease, r.LeaseFraction = 50, 0.5
		at := redisMs()
		lease, err := l.Do(ctx, r)
		if err != nil || lease.Granted != 4 {
			t.Fatalf("%s lease: %+v %v", a, lease, err)
		}
		awaitRedis(at + 600) // 5 taken at 10 a second: full again in half a second
		r.Lease, r.Cost = 0, 10
		if drained, err := l.Do(ctx, r); err != nil || !drained.Allowed || drained.Remaining != 0 {
			t.Fatalf("%s drain: %+v %v", a, drained, err)
		}
		r.Cost, r.Returned, r.LeasedAt = 0, lease.Granted, lease.WindowStart
		if back, err := l.Do(ctx, r); err != nil || back.Credited != 0 {
			t.Fatalf("%s hand-back once full again: %+v %v; want nothing credited", a, back, err)
		}
	}
}
