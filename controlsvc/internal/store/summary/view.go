package summary

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Windows a summary covers, and the step of its series.
var windows = map[string]struct{ span, step int64 }{ // minutes
	"5m":  {5, 1},
	"1h":  {60, 1},
	"24h": {1440, 15},
}

// Windows lists the windows a summary may ask for.
var Windows = []string{"5m", "1h", "24h"}

// View is the deployment's summary over a window: seed 001's
// RateLimitMetrics (by_tier and by_endpoint count throttled requests, as
// the seed has them), with the requests by tier, a series for charts and
// the most refused callers beside it.
type View struct {
	Window            string           `json:"window"`
	From              int64            `json:"from"` // Unix seconds, the first minute's start
	To                int64            `json:"to"`   // Unix seconds, the last minute's end
	TotalRequests     int64            `json:"total_requests"`
	ThrottledRequests int64            `json:"throttled_requests"`
	AllowedRequests   int64            `json:"allowed_requests"`
	ByTier            map[string]int64 `json:"by_tier"`
	ByEndpoint        map[string]int64 `json:"by_endpoint"`
	RequestsByTier    map[string]int64 `json:"requests_by_tier"`
	AvgCheckLatencyMs float64          `json:"avg_check_latency_ms"`
	P95CheckLatencyMs float64          `json:"p95_check_latency_ms"`
	RedisErrors       int64            `json:"redis_errors"`
	Series            []Point          `json:"series"`
	TopRefused        []Caller         `json:"top_refused"`
}

// Point is one step of the series.
type Point struct {
	At                int64            `json:"at"` // Unix seconds, the step's start
	Total             int64            `json:"total"`
	Throttled         int64            `json:"throttled"`
	ByTier            map[string]int64 `json:"by_tier"` // requests
	AvgCheckLatencyMs float64          `json:"avg_check_latency_ms"`
}

// Caller is one of the most refused.
type Caller struct {
	Identity string `json:"identity"`
	Refused  int64  `json:"refused"`
}

// Reader reads summaries.
type Reader struct{ b backend }

// NewReader reads st.
func NewReader(st Store) *Reader { return &Reader{b: st.b} }

// ErrWindow is returned for a window not in Windows.
var ErrWindow = fmt.Errorf("the window must be one of %v", Windows)

// Read summarises the window ending with the minute of now.
func (r *Reader) Read(ctx context.Context, window string, now time.Time) (View, error) {
	w, ok := windows[window]
	if !ok {
		return View{}, ErrWindow
	}
	to := now.Unix() / 60
	from := to - w.span + 1
	minutes, err := r.b.read(ctx, from, to)
	if err != nil {
		return View{}, err
	}
	v := View{Window: window, From: from * 60, To: (to + 1) * 60, ByTier: map[string]int64{}, ByEndpoint: map[string]int64{},
		RequestsByTier: map[string]int64{}, Series: []Point{}, TopRefused: []Caller{}}
	all := newMinute()
	for start := from; start <= to; start += w.step {
		step := newMinute()
		for m := start; m < start+w.step && m <= to; m++ {
			if mm, ok := minutes[m]; ok {
				merge(step, mm)
			}
		}
		p := Point{At: start * 60, Total: step.Total, Throttled: step.Throttled, ByTier: map[string]int64{}, AvgCheckLatencyMs: avgMs(step)}
		for name, c := range step.Tiers {
			p.ByTier[name] = c[0]
		}
		v.Series = append(v.Series, p)
		merge(all, step)
	}
	v.TotalRequests, v.ThrottledRequests, v.RedisErrors = all.Total, all.Throttled, all.RedisErrors
	v.AllowedRequests = all.Total - all.Throttled
	for name, c := range all.Tiers {
		v.RequestsByTier[name] = c[0]
		if c[1] > 0 {
			v.ByTier[name] = c[1]
		}
	}
	for name, c := range all.Endpoints {
		if c[1] > 0 {
			v.ByEndpoint[name] = c[1]
		}
	}
	v.AvgCheckLatencyMs, v.P95CheckLatencyMs = avgMs(all), quantileMs(all.Latency, 0.95)
	for id, n := range all.Refused {
		v.TopRefused = append(v.TopRefused, Caller{Identity: id, Refused: n})
	}
	sort.Slice(v.TopRefused, func(i, j int) bool {
		a, b := v.TopRefused[i], v.TopRefused[j]
		return a.Refused > b.Refused || a.Refused == b.Refused && a.Identity < b.Identity
	})
	if len(v.TopRefused) > 10 {
		v.TopRefused = v.TopRefused[:10]
	}
	return v, nil
}

func avgMs(m *Minute) float64 {
	if m.Total == 0 {
		return 0
	}
	return float64(m.LatencySumUs) / float64(m.Total) / 1000
}

// quantileMs estimates a quantile from the histogram, interpolating inside
// the bucket it falls in (as Prometheus's histogram_quantile does); above
// the last bound it is the last bound.
func quantileMs(buckets []int64, q float64) float64 {
	var total int64
	for _, n := range buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen int64
	for i, n := range buckets {
		if float64(seen+n) >= rank && n > 0 {
			if i == len(LatencyBounds) {
				return LatencyBounds[len(LatencyBounds)-1]
			}
			lo := 0.0
			if i > 0 {
				lo = LatencyBounds[i-1]
			}
			return lo + (LatencyBounds[i]-lo)*(rank-float64(seen))/float64(n)
		}
		seen += n
	}
	return LatencyBounds[len(LatencyBounds)-1]
}
