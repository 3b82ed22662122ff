// Package memlimit is the control service's in-memory limiter: what a
// replica counts with while Redis cannot be reached (failure_mode
// fail_open). It keeps each counter of the limiter's requests in this
// process only, at every rule's limit divided by the number of replicas,
// so that the replicas together admit about what the rule does. It is
// approximate by design: token_bucket and gcra are a token bucket, the
// window algorithms a fixed window (which admits up to twice the limit
// across a window's edge).
package memlimit

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// MaxCounters bounds the counters kept by default. At the bound, a
// counter that is whole again (its bucket refilled, its windows past) goes
// first, found among the least recently used; only when none of those is
// whole does the least recently used go, restarting whole if it comes back:
// under-counting one caller rather than growing without bound under a flood
// of new callers. A caller can therefore get a counter forgotten only by
// making more than the bound of other live counters meanwhile.
const MaxCounters = 100_000

// evictScan is how many of the least recently used counters are looked at
// for a whole one.
const evictScan = 64

// Limiter is the in-memory limiter; it is safe for concurrent use.
type Limiter struct {
	mu       sync.Mutex
	max      int
	replicas int64
	now      func() time.Time
	counters map[string]*list.Element
	lru      *list.List // front: most recently used
}

type counter struct {
	key string
	// Token bucket: tokens at stamp. Windows: the window's start (stamp)
	// and what is left in it (tokens counts down from the limit); prev is
	// what the window before it spent (sliding windows weigh it).
	tokens float64
	stamp  time.Time
	prev   float64
	// wholeAt is when the counter holds nothing any more (a full bucket,
	// windows past): forgetting it then loses nothing.
	wholeAt time.Time
	// held is what admissions reserved in the counter's current stretch
	// (limiter.Request.Reserve), the most a hand-back may give back;
	// fullAt starts a bucket's stretch (when it was last full), as the
	// scripts' own: a reserve comes back only into the stretch it came
	// from.
	held   float64
	fullAt time.Time
}

// New returns a limiter dividing every limit by replicas (at least 1),
// keeping at most MaxCounters counters.
func New(replicas int64, now func() time.Time) *Limiter { return NewSized(replicas, MaxCounters, now) }

// NewSized is New keeping at most n counters.
func NewSized(replicas int64, n int, now func() time.Time) *Limiter {
	return &Limiter{max: max(n, 1), replicas: max(replicas, 1), now: now, counters: map[string]*list.Element{}, lru: list.New()}
}

// SetReplicas changes the divisor (a configuration reload).
func (l *Limiter) SetReplicas(n int64) {
	l.mu.Lock()
	l.replicas = max(n, 1)
	l.mu.Unlock()
}

// Len is the number of counters kept.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.counters)
}

// Do decides one counter's request as the limiter would, locally. Leases
// are never granted: a degraded replica hands out nothing the filter could
// spend after Redis is back. A reserve is held and taken back (Returned,
// from the stretch LeasedAt names) when this limiter is the only one
// (redis_enabled = false; a degraded replica is sent none).
func (l *Limiter) Do(r limiter.Request) limiter.Result {
	q := r.Rule
	if q == nil || q.Limit <= 0 || q.WindowSeconds <= 0 {
		return limiter.Result{Allowed: true}
	}
	limit := max(q.Limit/l.replicas, 1)
	capacity := max(q.Capacity()/l.replicas, 1)
	window := time.Duration(q.WindowSeconds) * time.Second
	cost := float64(max(r.Cost, 0))
	admit := max(cost, float64(r.Admit)) // what must be left to pass
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.get(r.Key(), now)
	if q.Algorithm == rules.TokenBucket || q.Algorithm == rules.GCRA {
		rate := float64(limit) / window.Seconds() // tokens a second
		if c.stamp.IsZero() {
			c.tokens, c.stamp = float64(capacity), now
		}
		if c.fullAt.IsZero() {
			c.fullAt = now
		}
		if filled := c.tokens + now.Sub(c.stamp).Seconds()*rate; filled >= float64(capacity) {
			if c.tokens < float64(capacity) {
				c.fullAt = c.stamp.Add(time.Duration((float64(capacity) - c.tokens) / rate * float64(time.Second)))
			}
			c.tokens, c.held = float64(capacity), 0
		} else {
			c.tokens = filled
		}
		c.stamp = now
		if r.LeasedAt >= c.fullAt.UnixMicro() {
			c.takeBack(r)
			if r.Returned > 0 && c.tokens >= float64(capacity) {
				// Filled by it: a new stretch, as by a refill.
				c.tokens, c.held, c.fullAt = float64(capacity), 0, now
			}
		}
		if r.Charge {
			n := charged(cost, c.tokens, debtFloor(q.Scope, capacity, limit))
			c.tokens -= n
			full := time.Duration((float64(capacity) - c.tokens) / rate * float64(time.Second))
			c.wholeAt = now.Add(full)
			return limiter.Result{Allowed: true, Charged: int64(n), Remaining: max(int64(c.tokens), 0), ResetAfter: full}
		}
		full := time.Duration((float64(capacity) - c.tokens) / rate * float64(time.Second))
		// A refill is a sum of floats: at the moment a wait named, the
		// tokens can fall a rounding short of what it waited for.
		const eps = 1e-9
		if c.tokens+eps < admit || r.Peek && c.tokens+eps < 1 {
			// Up to the next millisecond, as the scripts round it: truncated,
			// the named moment held a token less a rounding's worth, refused.
			wait := time.Duration(math.Ceil((admit-c.tokens)/rate*1000)) * time.Millisecond
			if c.heldBack(r, c.tokens+eps >= cost) {
				wait = min(wait, time.Second)
			}
			c.wholeAt = now.Add(full)
			return limiter.Result{Remaining: int64(c.tokens), ResetAfter: full, RetryAfter: max(wait, time.Millisecond)}
		}
		var held float64
		if !r.Peek {
			c.tokens -= cost
			held = c.reserve(r.Reserve, c.tokens)
			full = time.Duration((float64(capacity) - c.tokens) / rate * float64(time.Second))
		}
		c.wholeAt = now.Add(full)
		return limiter.Result{Allowed: true, Remaining: int64(c.tokens), ResetAfter: full, Reserved: int64(held), WindowStart: c.fullAt.UnixMicro()}
	}
	start := now.Truncate(window)
	if r.Origin > 0 {
		start = time.UnixMilli(r.Origin) // a calendar period's start
	}
	if !c.stamp.Equal(start) {
		// What the last window spent, a charge's debt past its limit
		// carried as the scripts carry it: each window since paid a limit.
		spent, g := 0.0, 0.0
		if !c.stamp.IsZero() && start.After(c.stamp) {
			spent, g = float64(limit)-c.tokens, float64(start.Sub(c.stamp)/window)
		}
		c.prev = 0
		if g > 0 {
			c.prev = min(float64(limit), max(0, spent-float64(limit)*(g-1)))
		}
		c.tokens, c.stamp, c.held = float64(limit)-max(0, spent-float64(limit)*g), start, 0
	}
	if r.LeasedAt >= start.UnixMicro() && r.LeasedAt < start.Add(window).UnixMicro() {
		c.takeBack(r)
	}
	elapsed := now.Sub(start)
	reset := window - elapsed
	// The next window still weighs this one; a debt keeps it a window more
	// for each limit of it.
	c.wholeAt = start.Add(2*window + window*time.Duration(max(0, math.Ceil(-c.tokens/float64(limit)))))
	// The sliding estimate: what the previous window spent, weighted by how
	// much of it the sliding window still overlaps, plus this window's.
	fading := 0.0
	if q.Algorithm == rules.SlidingWindow || q.Algorithm == rules.SlidingLog {
		fading = c.prev * (1 - elapsed.Seconds()/window.Seconds())
	}
	left := c.tokens - fading
	if r.Charge {
		n := charged(cost, left, debtFloor(q.Scope, limit, limit))
		c.tokens -= n
		return limiter.Result{Allowed: true, Charged: int64(n), Remaining: max(int64(left-n), 0), ResetAfter: reset}
	}
	if left < admit {
		retry := reset
		if need := admit - left; fading >= need && c.prev > 0 {
			// The previous window's weight fades at prev per window.
			retry = time.Duration(need / c.prev * float64(window))
		} else if r.Origin == 0 {
			retry = debtRetry(float64(limit)-c.tokens, float64(limit), admit, q.Algorithm == rules.SlidingWindow || q.Algorithm == rules.SlidingLog, reset, window)
		}
		if c.heldBack(r, left >= cost) {
			retry = min(retry, time.Second)
		}
		return limiter.Result{Remaining: max(int64(left), 0), ResetAfter: reset, RetryAfter: max(retry, time.Millisecond)}
	}
	var held float64
	if !r.Peek {
		c.tokens -= cost
		left -= cost
		held = c.reserve(r.Reserve, left)
		left -= held
	}
	return limiter.Result{Allowed: true, Remaining: int64(left), ResetAfter: reset, Reserved: int64(held), WindowStart: start.UnixMicro()}
}

// takeBack settles a reserve of the counter's current stretch: what its
// response used (limiter.Request.Release) leaves the tokens held, so that
// they count only reserves in flight, and what it did not (Returned)
// comes back, never more than is held. Released first, as the scripts do.
func (c *counter) takeBack(r limiter.Request) {
	c.held -= math.Min(float64(r.Release), c.held)
	back := math.Min(float64(r.Returned), c.held)
	c.tokens, c.held = c.tokens+back, c.held-back
}

// heldBack reports whether a refusal of r is for want of its reserve
// alone (fits: the cost would pass) while reserves of the counter are in
// flight: their charges may hand some back at any moment, so it is told a
// second at most, as the scripts tell it.
func (c *counter) heldBack(r limiter.Request, fits bool) bool {
	return fits && r.Reserve > 0 && c.held > 0
}

// reserve takes up to n whole tokens of the left ones for an admission
// to hold (limiter.Request.Reserve) and says how many it took.
func (c *counter) reserve(n int64, left float64) float64 {
	take := math.Max(0, math.Min(float64(n), math.Floor(left)))
	c.tokens -= take
	c.held += take
	return take
}

// debtRetry is when a window counter that spent c of limit (a charge's debt
// past it carried a limit less each window, as the scripts carry it)
// first admits admit, reset being this window's rest: the first window g
// ahead whose own count leaves room, and with a sliding window, once the
// window before it (a limit at most) has faded enough. Told this window's
// end, a caller in debt was refused again there.
func debtRetry(c, limit, admit float64, sliding bool, reset, window time.Duration) time.Duration {
	g := max(1, math.Ceil((c+admit-limit)/limit))
	retry := reset + time.Duration(g-1)*window
	if sliding {
		cg := max(0, c-limit*g)
		if pg := min(limit, max(0, c-limit*(g-1))); pg > 0 {
			retry += time.Duration(max(0, 1-(limit-admit-cg)/pg) * float64(window))
		}
	}
	return retry
}

// debtFloor is how far below zero a charge may take a counter, as the
// limiter's scripts (prelude.lua's debt_floor): a hundred capacities, or
// one window's limit on a counter other callers share.
func debtFloor(s rules.Scope, capacity, limit int64) float64 {
	if limiter.ManyCallers(s) {
		return float64(limit)
	}
	return maxDebt * float64(capacity)
}

// maxDebt is prelude.lua's max_debt: the capacities a caller's own counter
// may owe.
const maxDebt = 100

// charged is what a charge of cost spends from a balance of left: all of
// it, down to a balance of -floor at most.
func charged(cost, left, floor float64) float64 {
	return max(0, min(cost, math.Floor(left+floor)))
}

// Count adds hits to key's fixed-window counter (aligned to the Unix epoch)
// and returns the window's hits: what the limiter's Count answers, every
// hit counted, refused or not. hits 0 reads.
func (l *Limiter) Count(key string, hits, windowSeconds int64) limiter.HitCount {
	window := time.Duration(max(windowSeconds, 1)) * time.Second
	now := l.now()
	start := now.Truncate(window)
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.get("hits\x00"+key, now)
	if !c.stamp.Equal(start) {
		c.tokens, c.stamp = 0, start
	}
	c.tokens += float64(max(hits, 0))
	c.wholeAt = start.Add(window)
	return limiter.HitCount{Count: int64(c.tokens), ResetSeconds: int64(math.Ceil(start.Add(window).Sub(now).Seconds()))}
}

// Reset forgets key's counter, reporting whether there was one.
func (l *Limiter) Reset(key string) bool {
	key = stored(key)
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.counters[key]
	if ok {
		l.lru.Remove(e)
		delete(l.counters, key)
	}
	return ok
}

// maxKey bounds a counter's name in memory: a longer one (a client's 8 KiB
// path in a per-endpoint counter) is kept under its SHA-256.
const maxKey = 256

// stored is the name a counter is kept under: key, or its digest when
// longer than maxKey.
func stored(key string) string {
	if len(key) <= maxKey {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// get returns key's counter, created or refreshed as most recently used.
func (l *Limiter) get(key string, now time.Time) *counter {
	key = stored(key)
	if e, ok := l.counters[key]; ok {
		l.lru.MoveToFront(e)
		return e.Value.(*counter)
	}
	if len(l.counters) >= l.max {
		old := l.lru.Back()
		for e, i := old, 0; e != nil && i < evictScan; e, i = e.Prev(), i+1 {
			if !e.Value.(*counter).wholeAt.After(now) {
				old = e // whole again: forgetting it loses nothing
				break
			}
		}
		l.lru.Remove(old)
		delete(l.counters, old.Value.(*counter).key)
	}
	c := &counter{key: key}
	l.counters[key] = l.lru.PushFront(c)
	return c
}

// Counters is the limiter as the decision service and the rate limit
// service use Redis's (redis_enabled = false): every counter in this
// process. Leases are never granted, penalties never applied.
type Counters struct{ L *Limiter }

// Do decides r.
func (c Counters) Do(_ context.Context, r limiter.Request) (limiter.Result, error) {
	return c.L.Do(r), nil
}

// DoAsync decides r at once.
func (c Counters) DoAsync(_ context.Context, r limiter.Request) (*limiter.PendingDo, error) {
	return limiter.Decided(c.L.Do(r)), nil
}

// CountAsync counts at once.
func (c Counters) CountAsync(_ context.Context, key string, hits, windowSeconds int64) (*limiter.PendingCount, error) {
	if hits < 0 || windowSeconds <= 0 {
		return nil, fmt.Errorf("%w: hits %d, window %d s", limiter.ErrBadRequest, hits, windowSeconds)
	}
	return limiter.Answered(c.L.Count(key, hits, windowSeconds)), nil
}

// Reset forgets r's counter.
func (c Counters) Reset(_ context.Context, r limiter.Request) (int64, error) {
	if c.L.Reset(r.Key()) {
		return 1, nil
	}
	return 0, nil
}

// Ping always answers: there is nothing to reach.
func (Counters) Ping(context.Context) error { return nil }
