// Package fallback is the per-VM limiter the filter uses while it fails open:
// a fixed window per caller, bounded in callers, so that a dead control
// service does not mean no limit at all.
package fallback

import "math"

// Limiter is not safe for concurrent use (one per VM).
type Limiter struct {
	limit      int64
	windowMs   int64
	maxCallers int
	counts     map[string]*window
	// head is the most recently seen caller, head.prev the least: a full
	// limiter forgets the caller it has not seen for longest, never all of
	// them (clearing everyone would hand every caller a fresh window).
	head *window
}

type window struct {
	caller     string
	start      int64
	n          int64
	prev, next *window
}

// New returns a limiter of limit requests per window per caller, tracking at
// most maxCallers callers (at least one).
func New(limit, windowSeconds int64, maxCallers int) *Limiter {
	return &Limiter{limit: limit, windowMs: max(windowSeconds, 1) * 1000, maxCallers: max(maxCallers, 1), counts: map[string]*window{}}
}

// Allow counts one request of caller at nowMs; when denied it also returns the
// milliseconds until the caller's window ends.
func (l *Limiter) Allow(caller string, nowMs int64) (bool, int64) {
	return l.AllowUpTo(caller, nowMs, l.limit)
}

// AllowUpTo is Allow with limit in place of the limiter's own, for this
// request (a caller whose limits the proxy has seen may be allowed more).
func (l *Limiter) AllowUpTo(caller string, nowMs, limit int64) (bool, int64) {
	w := l.window(caller, nowMs)
	if w.n >= limit {
		return false, w.start + l.windowMs - nowMs
	}
	w.n++
	return true, 0
}

// Exhaust spends what caller has left in its window at nowMs: a caller the
// control service has just refused gets nothing from the fallback until
// the window ends. Otherwise a refused client could flood the service with
// callouts that time out (each to a path no lease or cached denial holds),
// open the breaker, and be admitted degraded: an outsider's flood got 400
// a minute past a limit of 100 with the service healthy.
func (l *Limiter) Exhaust(caller string, nowMs int64) {
	l.window(caller, nowMs).n = math.MaxInt64
}

// window is caller's window at nowMs, made the most recent.
func (l *Limiter) window(caller string, nowMs int64) *window {
	start := nowMs - nowMs%l.windowMs
	w, ok := l.counts[caller]
	switch {
	case ok:
		l.unlink(w)
	case len(l.counts) >= l.maxCallers:
		// Full: the least recently seen caller's window is recycled for
		// this one (no allocation while a flood of new callers goes on).
		w = l.head.prev
		l.unlink(w)
		delete(l.counts, w.caller)
		*w = window{caller: caller, start: start}
		l.counts[caller] = w
	default:
		w = &window{caller: caller, start: start}
		l.counts[caller] = w
	}
	l.pushFront(w)
	if w.start != start {
		w.start, w.n = start, 0
	}
	return w
}

// pushFront makes w the most recent caller of the ring.
func (l *Limiter) pushFront(w *window) {
	if l.head == nil {
		w.prev, w.next = w, w
	} else {
		w.next, w.prev = l.head, l.head.prev
		l.head.prev.next = w
		l.head.prev = w
	}
	l.head = w
}

func (l *Limiter) unlink(w *window) {
	if w.next == w {
		l.head = nil
	} else {
		w.prev.next, w.next.prev = w.next, w.prev
		if l.head == w {
			l.head = w.next
		}
	}
	w.prev, w.next = nil, nil
}
