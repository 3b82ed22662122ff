package decision

import (
	"sync"
	"time"
)

// breaker stops calling Redis after repeated failures, so that a Redis that
// is down costs each check nothing instead of a dial; after the cooldown one
// call probes, and its success closes the breaker again.
type breaker struct {
	threshold int
	cooldown  time.Duration

	mu        sync.Mutex
	failures  int
	openUntil time.Time
}

func newBreaker(threshold int, cooldown time.Duration) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown}
}

// allow reports whether a call may go to Redis now. Once the cooldown is
// over, the first caller gets through as the probe and the window is pushed
// out again, so only one probe runs at a time.
func (b *breaker) allow(now time.Time) bool {
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

// record notes a call's outcome; it returns true when the state changed
// (opened or closed), for logging.
func (b *breaker) record(ok bool, now time.Time) (changed bool) {
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

// open reports whether the breaker is refusing calls.
func (b *breaker) open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures >= b.threshold
}
