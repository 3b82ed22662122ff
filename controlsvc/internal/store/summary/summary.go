// Package summary keeps the decisions of every replica per minute, for the
// operator's summary (seed 001's RateLimitMetrics) and the console: counts
// by result, tier and endpoint, the check latency's histogram, Redis
// errors, and the most refused callers. Observe only adds to memory; a
// flusher writes each minute's sums to Redis (or this process's memory)
// every interval, so the summary is the whole deployment's, not one
// replica's, and costs a check no Redis call.
package summary

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

// LatencyBounds are the check latency histogram's upper bounds, in
// milliseconds (the last bucket is everything above).
var LatencyBounds = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000}

// Bounds of what one minute keeps: further tiers and endpoints (per
// replica) are counted under Other, further refused callers are not named
// (their refusals still count), and the most refused are kept (in Redis,
// across replicas). Endpoints and identities are a client's choice (a path
// up to 8 KiB): they are kept to their first maxName bytes, so a client
// cycling long paths costs Redis at most about 20 KB a minute, 30 MB a day.
const (
	maxTiers     = 64
	maxEndpoints = 50
	maxRefused   = 100
	maxName      = 128
	// Other names what is past a bound.
	Other = "(other)"
	// TTL: a day of minutes is read.
	ttl = 25 * time.Hour
)

// Minute is one minute's sums.
type Minute struct {
	Total, Throttled, RedisErrors int64
	// Tiers and Endpoints: [total, throttled] each.
	Tiers     map[string]*[2]int64
	Endpoints map[string]*[2]int64
	// Latency counts checks per LatencyBounds bucket (one more: above);
	// LatencySumUs is their total in microseconds.
	Latency      []int64
	LatencySumUs int64
	Refused      map[string]int64
	// refused orders Refused's names by count while the recorder counts
	// (countRefused); nil elsewhere.
	refused *candidates
}

func newMinute() *Minute {
	return &Minute{Tiers: map[string]*[2]int64{}, Endpoints: map[string]*[2]int64{}, Latency: make([]int64, len(LatencyBounds)+1), Refused: map[string]int64{}}
}

// bump counts one check under name (named, or Other, by minuteNames).
func bump(m map[string]*[2]int64, name string, throttled bool) {
	c, ok := m[name]
	if !ok {
		c = &[2]int64{}
		m[name] = c
	}
	c[0]++
	if throttled {
		c[1]++
	}
}

// minuteNames are the tier and endpoint names one minute counts under
// their own names on this replica. They outlive the flushes: the pending
// sums are handed to the backend every second or so, and bounding only
// those let a client cycling paths name 50 new endpoints a flush, 3,000 a
// minute (an outsider's flood of 50 new paths a second grew Redis by 1 MB
// a minute and timed out the day's summary).
type minuteNames struct{ tiers, endpoints map[string]struct{} }

// as is what name is counted as: itself once it is among the minute's
// names or while they are fewer than bound, else Other.
func as(names map[string]struct{}, name string, bound int) string {
	if _, ok := names[name]; ok {
		return name
	}
	if len(names) >= bound {
		return Other
	}
	names[name] = struct{}{}
	return name
}

// Observation is one decided check.
type Observation struct {
	At        time.Time
	Throttled bool
	Tier      string
	Endpoint  string
	Identity  string // named among the refused when Throttled
	Latency   time.Duration
}

// Recorder gathers a replica's minutes between flushes.
type Recorder struct {
	b   backend
	log *slog.Logger

	mu      sync.Mutex
	pending map[int64]*Minute
	// names are the names of the minutes still observed (at most the
	// current one and the one before: a check decided across a minute's
	// edge).
	names map[int64]*minuteNames
}

type backend interface {
	add(ctx context.Context, pending map[int64]*Minute) error
	read(ctx context.Context, from, to int64) (map[int64]*Minute, error)
}

// Store is where the minutes are kept.
type Store struct{ b backend }

// InRedis keeps them in Redis, in one hash slot (the summary is read by
// operators, a few times a minute).
func InRedis(rdb redis.UniversalClient) Store { return Store{redisMinutes{rdb}} }

// InMemory keeps them in this process (redis_enabled = false).
func InMemory(now func() time.Time) Store {
	return Store{&memoryMinutes{m: map[int64]*Minute{}, now: now}}
}

// NewRecorder returns a recorder writing to st.
func NewRecorder(st Store, log *slog.Logger) *Recorder {
	return &Recorder{b: st.b, log: log, pending: map[int64]*Minute{}, names: map[int64]*minuteNames{}}
}

// Observe adds one decided check.
func (r *Recorder) Observe(o Observation) {
	o.Endpoint, o.Identity = clip(o.Endpoint), clip(o.Identity)
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.minute(o.At)
	m.Total++
	if o.Throttled {
		m.Throttled++
		countRefused(m, o.Identity)
	}
	names := r.minuteNames(o.At)
	bump(m.Tiers, as(names.tiers, o.Tier, maxTiers), o.Throttled)
	bump(m.Endpoints, as(names.endpoints, o.Endpoint, maxEndpoints), o.Throttled)
	ms := float64(o.Latency) / float64(time.Millisecond)
	i := sort.SearchFloat64s(LatencyBounds, ms)
	m.Latency[i]++
	m.LatencySumUs += o.Latency.Microseconds()
}

// clip keeps a client-chosen name to maxName bytes, marking the cut.
func clip(s string) string {
	if len(s) <= maxName {
		return s
	}
	return s[:maxName] + "..."
}

// RedisError counts a failed Redis call of the decision path.
func (r *Recorder) RedisError(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.minute(at).RedisErrors++
}

// minute is the pending sums of at's minute (r.mu held).
func (r *Recorder) minute(at time.Time) *Minute {
	k := at.Unix() / 60
	m, ok := r.pending[k]
	if !ok {
		m = newMinute()
		r.pending[k] = m
	}
	return m
}

// minuteNames is the names of at's minute (r.mu held). A new minute
// forgets those of minutes before the one before it.
func (r *Recorder) minuteNames(at time.Time) *minuteNames {
	k := at.Unix() / 60
	n, ok := r.names[k]
	if !ok {
		for old := range r.names {
			if old < k-1 {
				delete(r.names, old)
			}
		}
		n = &minuteNames{tiers: map[string]struct{}{}, endpoints: map[string]struct{}{}}
		r.names[k] = n
	}
	return n
}

// Flush writes what was gathered. On failure the sums are kept for the
// next flush.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	pending := r.pending
	r.pending = map[int64]*Minute{}
	r.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	if err := r.b.add(ctx, pending); err != nil {
		r.mu.Lock()
		for k, m := range pending {
			if cur, ok := r.pending[k]; ok {
				merge(m, cur)
			}
			r.pending[k] = m
		}
		r.mu.Unlock()
		return fmt.Errorf("write the summary: %w", err)
	}
	return nil
}

// Run flushes every interval until ctx ends, then once more.
func (r *Recorder) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := r.Flush(ctx); err != nil {
				r.log.Debug("summary not written; kept for the next flush", "err", err)
			}
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = r.Flush(fctx)
			cancel()
			return
		}
	}
}

// merge adds src into dst.
func merge(dst, src *Minute) {
	dst.Total += src.Total
	dst.Throttled += src.Throttled
	dst.RedisErrors += src.RedisErrors
	for _, pair := range [][2]map[string]*[2]int64{{dst.Tiers, src.Tiers}, {dst.Endpoints, src.Endpoints}} {
		for k, v := range pair[1] {
			c, ok := pair[0][k]
			if !ok {
				c = &[2]int64{}
				pair[0][k] = c
			}
			c[0] += v[0]
			c[1] += v[1]
		}
	}
	for i, n := range src.Latency {
		dst.Latency[i] += n
	}
	dst.LatencySumUs += src.LatencySumUs
	for k, n := range src.Refused {
		dst.Refused[k] += n
	}
}

// --- Redis: a hash and a sorted set per minute, in the {summary} slot.

type redisMinutes struct{ rdb redis.UniversalClient }

func (r redisMinutes) add(ctx context.Context, pending map[int64]*Minute) error {
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for minute, m := range pending {
			h := keys.SummaryMinute(minute)
			p.HIncrBy(ctx, h, "total", m.Total)
			p.HIncrBy(ctx, h, "throttled", m.Throttled)
			if m.RedisErrors > 0 {
				p.HIncrBy(ctx, h, "redis_errors", m.RedisErrors)
			}
			for name, c := range m.Tiers {
				p.HIncrBy(ctx, h, "t:"+name, c[0])
				if c[1] > 0 {
					p.HIncrBy(ctx, h, "tt:"+name, c[1])
				}
			}
			for name, c := range m.Endpoints {
				p.HIncrBy(ctx, h, "e:"+name, c[0])
				if c[1] > 0 {
					p.HIncrBy(ctx, h, "et:"+name, c[1])
				}
			}
			for i, n := range m.Latency {
				if n > 0 {
					p.HIncrBy(ctx, h, "l:"+strconv.Itoa(i), n)
				}
			}
			p.HIncrBy(ctx, h, "lsum", m.LatencySumUs)
			p.Expire(ctx, h, ttl)
			if len(m.Refused) > maxRefused {
				trimRefused(m.Refused) // only the most refused are written
			}
			if len(m.Refused) > 0 {
				z := keys.SummaryRefused(minute)
				for id, n := range m.Refused {
					p.ZIncrBy(ctx, z, float64(n), id)
				}
				// The most refused are what is shown: the rest of a flood of
				// callers would only grow the set.
				p.ZRemRangeByRank(ctx, z, 0, -maxRefused-1)
				p.Expire(ctx, z, ttl)
			}
		}
		return nil
	})
	return err
}

func (r redisMinutes) read(ctx context.Context, from, to int64) (map[int64]*Minute, error) {
	hashes := make(map[int64]*redis.MapStringStringCmd, to-from+1)
	zsets := make(map[int64]*redis.ZSliceCmd, to-from+1)
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for minute := from; minute <= to; minute++ {
			hashes[minute] = p.HGetAll(ctx, keys.SummaryMinute(minute))
			zsets[minute] = p.ZRevRangeWithScores(ctx, keys.SummaryRefused(minute), 0, 99)
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("read the summary: %w", err)
	}
	out := map[int64]*Minute{}
	for minute, cmd := range hashes {
		fields := cmd.Val()
		if len(fields) == 0 {
			continue
		}
		m := newMinute()
		for k, v := range fields {
			n, _ := strconv.ParseInt(v, 10, 64)
			switch {
			case k == "total":
				m.Total = n
			case k == "throttled":
				m.Throttled = n
			case k == "redis_errors":
				m.RedisErrors = n
			case k == "lsum":
				m.LatencySumUs = n
			case strings.HasPrefix(k, "t:"):
				pair(m.Tiers, k[2:])[0] = n
			case strings.HasPrefix(k, "tt:"):
				pair(m.Tiers, k[3:])[1] = n
			case strings.HasPrefix(k, "e:"):
				pair(m.Endpoints, k[2:])[0] = n
			case strings.HasPrefix(k, "et:"):
				pair(m.Endpoints, k[3:])[1] = n
			case strings.HasPrefix(k, "l:"):
				if i, err := strconv.Atoi(k[2:]); err == nil && i >= 0 && i < len(m.Latency) {
					m.Latency[i] = n
				}
			}
		}
		for _, z := range zsets[minute].Val() {
			if id, ok := z.Member.(string); ok {
				m.Refused[id] = int64(z.Score)
			}
		}
		out[minute] = m
	}
	return out, nil
}

func pair(m map[string]*[2]int64, name string) *[2]int64 {
	c, ok := m[name]
	if !ok {
		c = &[2]int64{}
		m[name] = c
	}
	return c
}

// --- memory

type memoryMinutes struct {
	mu  sync.Mutex
	m   map[int64]*Minute
	now func() time.Time
}

func (s *memoryMinutes) add(_ context.Context, pending map[int64]*Minute) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	oldest := s.now().Add(-ttl).Unix() / 60
	for k := range s.m {
		if k < oldest {
			delete(s.m, k)
		}
	}
	for k, m := range pending {
		cur, ok := s.m[k]
		if !ok {
			cur = newMinute()
			s.m[k] = cur
		}
		merge(cur, m)
		if len(cur.Refused) > maxRefused {
			trimRefused(cur.Refused)
		}
	}
	return nil
}

func (s *memoryMinutes) read(_ context.Context, from, to int64) (map[int64]*Minute, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64]*Minute{}
	for k, m := range s.m {
		if k >= from && k <= to {
			c := newMinute()
			merge(c, m)
			out[k] = c
		}
	}
	return out, nil
}

// refusedCandidates is how many names a minute counts refusals for until
// its flush, which keeps the maxRefused most refused. Past it, a new name
// takes the place of the least refused and its count, plus one
// (Space-Saving): a caller refused more than a refusedCandidates-th of the
// minute's refusals is always counted and named, however many others are
// refused, and a count is at most over by what its place held. Counted in
// the order they came, a flood of refused decoys (an outsider's 12,000 a
// second) had its first hundred named and the abuser behind them not.
const refusedCandidates = 1024

// countRefused counts a refusal of id in m's Refused.
func countRefused(m *Minute, id string) {
	if m.refused == nil {
		m.refused = &candidates{counts: m.Refused, pos: map[string]int{}}
	}
	c := m.refused
	if i, ok := c.pos[id]; ok {
		c.counts[id]++
		heap.Fix(c, i)
		return
	}
	if len(c.names) < refusedCandidates {
		c.counts[id] = 1
		heap.Push(c, id)
		return
	}
	least := c.names[0]
	n := c.counts[least]
	delete(c.counts, least)
	delete(c.pos, least)
	c.names[0], c.pos[id], c.counts[id] = id, 0, n+1
	heap.Fix(c, 0)
}

// candidates is a min-heap of names by their count in counts.
type candidates struct {
	counts map[string]int64
	names  []string
	pos    map[string]int
}

func (c *candidates) Len() int           { return len(c.names) }
func (c *candidates) Less(i, j int) bool { return c.counts[c.names[i]] < c.counts[c.names[j]] }
func (c *candidates) Swap(i, j int) {
	c.names[i], c.names[j] = c.names[j], c.names[i]
	c.pos[c.names[i]], c.pos[c.names[j]] = i, j
}
func (c *candidates) Push(x any) {
	c.pos[x.(string)] = len(c.names)
	c.names = append(c.names, x.(string))
}
func (c *candidates) Pop() any {
	last := c.names[len(c.names)-1]
	c.names = c.names[:len(c.names)-1]
	delete(c.pos, last)
	return last
}

// trimRefused keeps the maxRefused most refused.
func trimRefused(m map[string]int64) {
	type kv struct {
		id string
		n  int64
	}
	all := make([]kv, 0, len(m))
	for id, n := range m {
		all = append(all, kv{id, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].id < all[j].id })
	for _, e := range all[maxRefused:] {
		delete(m, e.id)
	}
}
