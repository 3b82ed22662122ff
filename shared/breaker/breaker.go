// Package breaker is a circuit breaker: after repeated failures it stops calls
// to a dependency for a cooldown, so that a dead dependency costs nothing per
// request; then one call probes, and its success closes the breaker again.
// The control service puts one in front of Redis, the filter one in front of
// its callouts. Time is passed in, so tests pin it.
package breaker

import (
	"math"
	"sync"
	"time"
)

// Breaker is safe for concurrent use.
//
// Its times are int64 nanoseconds since base, not time.Time or Duration:
// a struct field of a time type, in a value a Wasm guest holds behind an
// interface, keeps time's formatting code (30 kB) in the filter's module.
type Breaker struct {
	threshold int
	cooldown  int64

	mu        sync.Mutex
	failures  int
	openUntil int64
}

// base is what the breakers' times count from: with the monotonic clock
// when the times passed in have it (the service's time.Now), by the wall
// clock otherwise (the filter's).
var base = time.Now()

func since(t time.Time) int64 { return int64(t.Sub(base)) }

// until is when a cooldown that starts at now ends; it saturates rather
// than wrap (a wrapped end would be in the past: the breaker would never
// hold).
func (b *Breaker) until(now time.Time) int64 {
	t := since(now)
	if b.cooldown > 0 && t > math.MaxInt64-b.cooldown {
		return math.MaxInt64
	}
	return t + b.cooldown
}

// New returns a closed breaker that opens after threshold consecutive
// failures, for cooldown.
func New(threshold int, cooldown time.Duration) *Breaker {
	return &Breaker{threshold: max(threshold, 1), cooldown: int64(cooldown)}
}

// Allow reports whether a call may go to Redis now. Once the cooldown is
// over, the first caller gets through as the probe and the window is pushed
// out again, so only one probe runs at a time.
func (b *Breaker) Allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.threshold {
		return true
	}
	if since(now) < b.openUntil {
		return false
	}
	b.openUntil = b.until(now)
	return true
}

// Record notes a call's outcome; it returns true when the state changed
// (opened or closed), for logging.
func (b *Breaker) Record(ok bool, now time.Time) (changed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		changed = b.failures >= b.threshold
		b.failures = 0
		return changed
	}
	b.failures++
	if b.failures >= b.threshold {
		b.openUntil = b.until(now)
		return b.failures == b.threshold
	}
	return false
}

// Open reports whether the breaker is refusing calls.
func (b *Breaker) Open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= b.threshold
}
