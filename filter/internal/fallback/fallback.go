// Package fallback is the per-VM limiter the filter uses while it fails open:
// a fixed window per caller, bounded in callers, so that a dead control
// service does not mean no limit at all.
package fallback

// Limiter is not safe for concurrent use (one per VM).
type Limiter struct {
	limit      int64
	windowMs   int64
	maxCallers int
	counts     map[string]*window
}

type window struct {
	start int64
	n     int64
}

// New returns a limiter of limit requests per window per caller.
func New(limit, windowSeconds int64, maxCallers int) *Limiter {
	return &Limiter{limit: limit, windowMs: windowSeconds * 1000, maxCallers: maxCallers, counts: map[string]*window{}}
}

// Allow counts one request of caller at nowMs; when denied it also returns the
// milliseconds until the caller's window ends.
func (l *Limiter) Allow(caller string, nowMs int64) (bool, int64) {
	start := nowMs - nowMs%l.windowMs
	w, ok := l.counts[caller]
	if !ok {
		if len(l.counts) >= l.maxCallers {
			// Bounded memory beats exact fallback counts: start over.
			clear(l.counts)
		}
		w = &window{start: start}
		l.counts[caller] = w
	}
	if w.start != start {
		w.start, w.n = start, 0
	}
	if w.n >= l.limit {
		return false, w.start + l.windowMs - nowMs
	}
	w.n++
	return true, 0
}
