// Package breaker is a circuit breaker: after repeated failures it stops calls
// to a dependency for a cooldown, so that a dead dependency costs nothing per
// request; then one call probes, and its success closes the breaker again.
// The control service puts one in front of Redis, the filter one in front of
// its callouts. Time is passed in, so tests pin it.
package breaker

import (
	"math"
	"sync"
)

// Breaker is safe for concurrent use.
//
// Its times are int64 nanoseconds (a caller's Unix nanoseconds; only their
// differences matter), not time.Time or Duration: the filter's module
// links no package time.
type Breaker struct {
	threshold int
	cooldown  int64

	mu        sync.Mutex
	failures  int
	openUntil int64
}

// until is when a cooldown that starts at now ends; it saturates rather
// than wrap (a wrapped end would be in the past: the breaker would never
// hold).
func (b *Breaker) until(now int64) int64 {
	if b.cooldown > 0 && now > math.MaxInt64-b.cooldown {
		return math.MaxInt64
	}
	return now + b.cooldown
}

// New returns a closed breaker that opens after threshold consecutive
// failures, for cooldown nanoseconds.
func New(threshold int, cooldown int64) *Breaker {
	return &Breaker{threshold: max(threshold, 1), cooldown: cooldown}
}

// Allow reports whether a call may go to Redis now. Once the cooldown is
// over, the first caller gets through as the probe and the window is pushed
// out again, so only one probe runs at a time.
func (b *Breaker) Allow(now int64) bool {
	ok, _ := b.Admit(now)
	return ok
}

// Admit is Allow that also says whether the call let through is the probe
// of an open breaker, in one step (asked apart, a probe recorded in
// between made a healthy node's batch a probe, its other calls refused).
func (b *Breaker) Admit(now int64) (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures < b.threshold {
		return true, false
	}
	if now < b.openUntil {
		return false, false
	}
	b.openUntil = b.until(now)
	return true, true
}

// Record notes a call's outcome; it returns true when the state changed
// (opened or closed), for logging.
func (b *Breaker) Record(ok bool, now int64) (changed bool) {
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

// Retry notes that a call let through said nothing of the dependency (its
// trouble was another's, or one part's): while the breaker is open the
// next call probes at once, rather than a cooldown after this one. A probe
// whose answer is not recorded held the breaker open a cooldown more for
// every caller (an outsider's failover: 1.2 s after the cluster was back).
func (b *Breaker) Retry(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures >= b.threshold && b.openUntil > now {
		b.openUntil = now
	}
}

// Open reports whether the breaker is refusing calls.
func (b *Breaker) Open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= b.threshold
}
