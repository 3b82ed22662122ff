// Package usage counts what each identity was admitted, per minute and per
// hour, and keeps violations for the audit trail, off the decision path:
// Record only adds to memory, and a flusher writes the sums to Redis in one
// pipeline every interval. A crash loses at most one interval of counts.
package usage

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
)

// How long counters live: a day of hours is read, two hours of minutes.
const (
	hourTTL   = 25 * time.Hour
	minuteTTL = 2 * time.Hour
)

// flushAt is how many (identity, minute) slots or audit events wake the
// flusher before its interval: a flood of new identities (an outsider's,
// 30,000 a second) is written as it comes rather than pushing honest
// callers' counts out. maxPending bounds what waits for a write when
// Redis cannot keep up: beyond it, counts and events are dropped and
// counted as dropped.
const (
	flushAt    = 10_000
	maxPending = 4 * flushAt
)

type counts struct{ requests, violations int64 }

type slot struct {
	identity string
	minute   int64 // Unix minute
}

// Recorder gathers counts and violations between flushes.
type Recorder struct {
	counters backend
	trail    *audit.Store
	log      *slog.Logger

	mu      sync.Mutex
	pending map[slot]*counts
	events  []audit.Event
	dropped int64
	// full wakes Run when flushAt is reached.
	full chan struct{}
}

// backend keeps the counters: Redis, or this process's memory.
type backend interface {
	add(ctx context.Context, pending map[slot]*counts) error
	read(ctx context.Context, identity string, windowStart, now time.Time) (Report, error)
}

// Store is where the counters are kept, for a Recorder and a Reader.
type Store struct{ b backend }

// InRedis keeps the counters in Redis, expiring with Redis's clock.
func InRedis(rdb redis.UniversalClient) Store { return Store{redisCounters{rdb}} }

// InMemory keeps the counters in this process's memory (redis_enabled =
// false), each dropped when Redis would have expired it.
func InMemory(now func() time.Time) Store {
	return Store{&memoryCounters{now: now, hours: map[slot]counts{}, minutes: map[slot]int64{}}}
}

// NewRecorder returns a recorder writing to st and trail.
func NewRecorder(st Store, trail *audit.Store, log *slog.Logger) *Recorder {
	return &Recorder{counters: st.b, trail: trail, log: log, pending: map[slot]*counts{}, full: make(chan struct{}, 1)}
}

// Record counts requests admitted for identity at `at` (tokens, under a
// rule that counts them), and a violation (with its audit event) when v is
// not nil: v.Cost of them, at least 1. It never waits on Redis.
func (r *Recorder) Record(identity string, at time.Time, requests int64, v *audit.Event) {
	k := slot{identity, at.Unix() / 60}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.pending[k]
	if c == nil {
		if len(r.pending) >= maxPending {
			r.dropped++
			return
		}
		c = &counts{}
		r.pending[k] = c
	}
	c.requests += requests
	if v != nil {
		// A violation of a rule that counts tokens counts the tokens it
		// asked for, as its usage counts tokens spent.
		c.violations += max(v.Cost, 1)
		if len(r.events) < maxPending {
			r.events = append(r.events, *v)
		} else {
			r.dropped++
		}
	}
	if len(r.pending) >= flushAt || len(r.events) >= flushAt {
		select {
		case r.full <- struct{}{}:
		default: // a flush is already asked for
		}
	}
}

// Run flushes every interval until ctx ends, then once more.
func (r *Recorder) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r.flushLogged(fctx)
			cancel()
			return
		case <-t.C:
			r.flushLogged(ctx)
		case <-r.full:
			r.flushLogged(ctx)
		}
	}
}

func (r *Recorder) flushLogged(ctx context.Context) {
	if err := r.Flush(ctx); err != nil {
		r.log.Warn("usage counts not written; they are lost", "err", err)
	}
}

// Flush writes what was gathered since the last flush.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	pending, events, dropped := r.pending, r.events, r.dropped
	r.pending, r.events, r.dropped = map[slot]*counts{}, nil, 0
	r.mu.Unlock()
	if dropped > 0 {
		r.log.Warn("usage recorder over its bound; entries dropped", "dropped", dropped)
	}
	if len(pending) > 0 {
		if err := r.counters.add(ctx, pending); err != nil {
			return err
		}
	}
	return r.trail.Append(ctx, events...)
}

type redisCounters struct{ rdb redis.UniversalClient }

func (r redisCounters) add(ctx context.Context, pending map[slot]*counts) error {
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, c := range pending {
			hk, mk := keys.UsageHour(k.identity, k.minute/60), keys.UsageMinute(k.identity, k.minute)
			p.HIncrBy(ctx, hk, "requests", c.requests)
			p.HIncrBy(ctx, mk, "requests", c.requests)
			if c.violations > 0 {
				p.HIncrBy(ctx, hk, "violations", c.violations)
			}
			p.Expire(ctx, hk, hourTTL)
			p.Expire(ctx, mk, minuteTTL)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("write usage: %w", err)
	}
	return nil
}

// Report is what an identity was admitted: in a window that ends at the
// current minute, and over the last 24 hours.
type Report struct {
	WindowRequests int64
	DayRequests    int64
	DayViolations  int64
}

// Reader reads the counters.
type Reader struct{ counters backend }

// NewReader returns a reader of st.
func NewReader(st Store) *Reader { return &Reader{counters: st.b} }

// Read sums an identity's counters: the minutes of the window starting at
// windowStart (minute resolution) and the last 24 hours (hour resolution).
func (r *Reader) Read(ctx context.Context, identity string, windowStart, now time.Time) (Report, error) {
	return r.counters.read(ctx, identity, windowStart, now)
}

// read reads in one round trip.
func (r redisCounters) read(ctx context.Context, identity string, windowStart, now time.Time) (Report, error) {
	rdb := r.rdb
	var hours, minutes []*redis.SliceCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		h := now.Unix() / 3600
		for i := int64(0); i < 24; i++ {
			hours = append(hours, p.HMGet(ctx, keys.UsageHour(identity, h-i), "requests", "violations"))
		}
		for m := windowStart.Unix() / 60; m <= now.Unix()/60; m++ {
			minutes = append(minutes, p.HMGet(ctx, keys.UsageMinute(identity, m), "requests"))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return Report{}, fmt.Errorf("read usage: %w", err)
	}
	var out Report
	for _, c := range hours {
		v := c.Val()
		out.DayRequests += number(v, 0)
		out.DayViolations += number(v, 1)
	}
	for _, c := range minutes {
		out.WindowRequests += number(c.Val(), 0)
	}
	return out, nil
}

func number(vals []any, i int) int64 {
	if i >= len(vals) {
		return 0
	}
	s, _ := vals[i].(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// maxMemorySlots bounds the minutes a memory store keeps (two hours of
// them per caller): past it, counts of callers' new minutes are dropped.
const maxMemorySlots = 1_000_000

// memoryCounters keeps hours (requests and violations) and minutes
// (requests) by identity, as the Redis hashes do.
type memoryCounters struct {
	now     func() time.Time
	mu      sync.Mutex
	hours   map[slot]counts // slot.minute holds the Unix hour
	minutes map[slot]int64
	swept   time.Time
}

func (m *memoryCounters) add(_ context.Context, pending map[slot]*counts) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, c := range pending {
		if _, ok := m.minutes[k]; !ok && len(m.minutes) >= maxMemorySlots {
			continue // bounded: a new caller's minute is not counted
		}
		h := slot{k.identity, k.minute / 60}
		hc := m.hours[h]
		hc.requests += c.requests
		hc.violations += c.violations
		m.hours[h] = hc
		m.minutes[k] += c.requests
	}
	// Drop what Redis would have expired (hourTTL, minuteTTL), once a minute.
	if now := m.now(); now.Sub(m.swept) >= time.Minute {
		m.swept = now
		maps.DeleteFunc(m.hours, func(k slot, _ counts) bool { return now.Unix()/3600-k.minute > int64(hourTTL/time.Hour) })
		maps.DeleteFunc(m.minutes, func(k slot, _ int64) bool { return now.Unix()/60-k.minute > int64(minuteTTL/time.Minute) })
	}
	return nil
}

func (m *memoryCounters) read(_ context.Context, identity string, windowStart, now time.Time) (Report, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out Report
	h := now.Unix() / 3600
	for i := int64(0); i < 24; i++ {
		c := m.hours[slot{identity, h - i}]
		out.DayRequests += c.requests
		out.DayViolations += c.violations
	}
	for mn := windowStart.Unix() / 60; mn <= now.Unix()/60; mn++ {
		out.WindowRequests += m.minutes[slot{identity, mn}]
	}
	return out, nil
}
