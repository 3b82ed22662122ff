// Package breaker is a circuit breaker: after repeated failures it stops calls
// to a dependency for a cooldown, so that a dead dependency costs nothing per
// request; then one call probes, and its success closes the breaker again.
// The control service puts one in front of Redis, the filter one in front of
// its callouts. Time is passed in, so tests pin it.
package breaker

import (
	"sync"
	"time"
)

// Breaker is safe for concurrent use.
type Breaker struct {
	threshold int
	cooldown  time.Duration

	mu        sync.Mutex
	failures  int
	openUntil time.Time
}

// New returns a closed breaker that opens after threshold consecutive
// failures, for cooldown.
func New(threshold int, cooldown time.Duration) *Breaker {
	return &Breaker{threshold: max(threshold, 1), cooldown: cooldown}
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
	if now.Before(b.openUntil) {
		return false
	}
	b.openUntil = now.Add(b.cooldown)
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
		b.openUntil = now.Add(b.cooldown)
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
