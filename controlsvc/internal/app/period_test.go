package app_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// A daily quota in the caller's time zone sits beside the tier's per-minute
// limit: the answers name whichever binds (the minute's while it has fewer
// left, then the day's), and the day's refusal resets at the zone's next
// midnight. Counted in Redis and, the same way, in memory.
func TestCalendarQuotaBesideARate(t *testing.T) {
	const toml = `
[[tiers]]
name = "free"
limit = 5
window_seconds = 60
[[rules]]
id = "daily"
path = "/api/*"
scope = "user"
algorithm = "fixed_window"
limit = 3
period = "day"
time_zone = "Asia/Tokyo"
`
	for _, mode := range []struct {
		name string
		env  map[string]string
	}{{"redis", nil}, {"in_memory", inMemory}} {
		t.Run(mode.name, func(t *testing.T) {
			s := startService(t, toml, mode.env)
			tokyo, _ := policy.Zone("Asia/Tokyo")
			req := map[string]any{"user_id": "user:hana", "endpoint": "/api/chat"}
			for i := 1; i <= 3; i++ {
				r := s.check(req)
				m := r.json(t)
				if r.status != 200 || m["rule_id"] != "daily" || num(t, m, "remaining") != int64(3-i) {
					t.Fatalf("check %d: %d %s", i, r.status, r.body)
				}
			}
			r := s.check(req)
			m := r.json(t)
			_, midnight := decision.PeriodBounds(rules.PeriodDay, tokyo, time.Now())
			if r.status != http.StatusTooManyRequests || m["rule_id"] != "daily" || num(t, m, "reset_at") != midnight.Unix() ||
				r.header.Get("X-RateLimit-Reset") != strconv.FormatInt(midnight.Unix(), 10) || num(t, m, "window_seconds") != 86400 {
				t.Fatalf("over the day's quota: %d %s (want reset at %d)", r.status, r.body, midnight.Unix())
			}
			if retry := num(t, m, "retry_after"); retry < 1 || retry > int64(time.Until(midnight).Seconds())+1 {
				t.Fatalf("retry after %d s; Tokyo's midnight is %v away", retry, time.Until(midnight))
			}
			// Another path outside the rule: the tier's minute binds.
			if r := s.check(map[string]any{"user_id": "user:hana", "endpoint": "/other"}); r.status != 200 || r.json(t)["rule_id"] != "tier_free" {
				t.Fatalf("outside the quota: %d %s", r.status, r.body)
			}
		})
	}
}
