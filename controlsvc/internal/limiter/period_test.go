package limiter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// A calendar period is a fixed window counted from its start (Origin):
// exact under concurrency, reset at its end whatever the epoch says, and a
// new period starts a counter of its own. The window and origin here are a
// day that began 5 h ago: not aligned to the epoch's days.
func TestCalendarPeriod(t *testing.T) {
	l, rdb := newLimiter(t)
	ctx := context.Background()
	now := time.Now()
	start := now.Add(-5 * time.Hour).Truncate(time.Second)
	end := start.Add(24 * time.Hour)
	r := req(rules.FixedWindow, "period", 100, 86400)
	r.Origin = start.UnixMilli()
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := l.Do(ctx, r)
			if err != nil {
				t.Error(err)
				return
			}
			if res.Allowed {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 100 {
		t.Fatalf("admitted %d of 150 at a limit of 100", admitted)
	}
	res, err := l.Do(ctx, r)
	if err != nil || res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	// Reset and retry name the period's end (Redis's clock against ours:
	// within a second).
	if d := time.Until(end) - res.ResetAfter; d < -time.Second || d > time.Second || res.RetryAfter != res.ResetAfter {
		t.Fatalf("reset after %v, retry after %v; the period ends in %v", res.ResetAfter, res.RetryAfter, time.Until(end))
	}
	if ttl := rdb.PTTL(ctx, r.Key()).Val(); ttl < time.Until(end) || ttl > time.Until(end)+25*time.Hour {
		t.Fatalf("counter TTL %v, want past the period's end and not a second period beyond", ttl)
	}
	// A charge's debt refuses no further than the period's end, where the
	// next period's counter starts afresh: told to come back in days of
	// debt, a caller was refused nothing after midnight (attack 56 F5).
	c := r
	c.Charge, c.Cost = true, 5000
	if res, err := l.Do(ctx, c); err != nil || res.Charged != 5000 {
		t.Fatalf("a charge of fifty limits: %+v %v", res, err)
	}
	if res, err := l.Do(ctx, r); err != nil || res.Allowed || res.RetryAfter > res.ResetAfter || time.Until(end)-res.RetryAfter > time.Second {
		t.Fatalf("in debt: %+v %v; want refused until the period's end, %v away", res, err, time.Until(end))
	}
	if ttl := rdb.PTTL(ctx, r.Key()).Val(); ttl > time.Until(end)+25*time.Hour {
		t.Fatalf("counter TTL %v in debt, want no period beyond the next", ttl)
	}
	// The next period (a later origin) counts from zero in its own counter.
	next := r
	next.Origin = end.UnixMilli()
	if next.Key() == r.Key() {
		t.Fatal("two periods share a counter")
	}
	if res, err := l.Do(ctx, next); err != nil || !res.Allowed || res.Remaining != 99 {
		t.Fatalf("next period: %+v %v", res, err)
	}
}

// When Redis's clock is past the period's end while the service's is still
// in it, the period keeps its one window: no second quota at midnight.
func TestCalendarPeriodUnderClockSkew(t *testing.T) {
	l, _ := newLimiter(t)
	ctx := context.Background()
	r := req(rules.FixedWindow, "skew", 2, 86400)
	r.Origin = time.Now().Add(-24*time.Hour - 2*time.Second).UnixMilli() // ended 2 s ago by Redis's clock
	for i := range 3 {
		res, err := l.Do(ctx, r)
		if err != nil || res.Allowed != (i < 2) {
			t.Fatalf("request %d: %+v %v", i+1, res, err)
		}
	}
}
