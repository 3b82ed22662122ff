package app_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

const seed001 = `
default_tier = "free"
[[tiers]]
name = "free"
limit = 100
window_seconds = 60
algorithm = "sliding_log"

[[tiers]]
name = "premium"
limit = 1000
window_seconds = 60
algorithm = "sliding_log"
[tiers.endpoints]
"/api/v1/request" = 50
`

// Seed 001, scenario 1: a free-tier user hits its limit; the 101st request is
// refused with Retry-After, and a new window lets it in again.
func TestSeed001FreeTierHitsLimit(t *testing.T) {
	s := startService(t, seed001, nil)
	user := "550e8400-e29b-41d4-a716-446655440000"
	req := map[string]any{"user_id": user, "endpoint": "/api/v1/request"}
	var last *response
	for i := 1; i <= 100; i++ {
		last = s.check(req)
		if last.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, last.status, last.body)
		}
	}
	if got := last.header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Fatalf("100th request: X-RateLimit-Remaining %q, want 0", got)
	}
	if got := last.header.Get("X-RateLimit-Limit"); got != "100" {
		t.Fatalf("X-RateLimit-Limit %q, want 100", got)
	}
	denied := s.check(req)
	if denied.status != http.StatusTooManyRequests {
		t.Fatalf("101st request: %d %s", denied.status, denied.body)
	}
	retry, err := strconv.Atoi(denied.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 60 {
		t.Fatalf("Retry-After %q, want 1..60", denied.header.Get("Retry-After"))
	}
	// Age every entry of the log past the window instead of waiting a minute.
	key := "rl:{identity:user:" + user + "}:tier_free:/api/v1/request:sliding_log:60"
	ctx := context.Background()
	// Entries are scored by time; the log's running total sits below them.
	members, err := s.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "0", Max: "+inf"}).Result()
	if err != nil || len(members) != 100 {
		t.Fatalf("log %s has %d entries (%v), want 100", key, len(members), err)
	}
	old := float64(time.Now().Add(-61 * time.Second).UnixMilli())
	for _, m := range members {
		s.rdb.ZAdd(ctx, key, redisZ(old, m))
	}
	if again := s.check(req); again.status != http.StatusOK {
		t.Fatalf("after the window: %d %s", again.status, again.body)
	}
}

// Seed 001, scenario 2: a premium user's endpoint override (50) is stricter
// than the tier (1000); another endpoint keeps the tier's independent limit.
func TestSeed001PremiumEndpointOverride(t *testing.T) {
	s := startService(t, seed001, nil)
	req := map[string]any{"user_id": "premium-user-001", "tier": "premium", "endpoint": "/api/v1/request"}
	for i := 1; i <= 50; i++ {
		if r := s.check(req); r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	r := s.check(req)
	if r.status != http.StatusTooManyRequests || num(t, r.json(t), "limit") != 50 {
		t.Fatalf("51st request: %d %s; want 429 at limit 50", r.status, r.body)
	}
	r = s.check(map[string]any{"user_id": "premium-user-001", "tier": "premium", "endpoint": "/api/v1/health"})
	m := r.json(t)
	if r.status != http.StatusOK || num(t, m, "limit") != 1000 || num(t, m, "remaining") != 999 {
		t.Fatalf("other endpoint: %d %s; want allowed at limit 1000, 999 left", r.status, r.body)
	}
}

// Seed 003: the 429 carries Retry-After, the X-RateLimit-* headers and the
// RATE_LIMIT_EXCEEDED body with limit, window, reset time and retry seconds.
func TestSeed003TooManyRequestsBody(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "", nil)
	req := map[string]any{"user_id": "key:k_demo", "endpoint": "/api/v1/posts", "limit": 2, "window_seconds": 60, "strategy": "fixed_window"}
	s.check(req)
	s.check(req)
	r := s.check(req)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", r.status)
	}
	for _, h := range []string{"Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if r.header.Get(h) == "" {
			t.Errorf("429 lacks %s", h)
		}
	}
	if r.header.Get("X-RateLimit-Remaining") != "0" || r.header.Get("X-RateLimit-Limit") != "2" {
		t.Errorf("headers %v", r.header)
	}
	reset, _ := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64)
	if now := time.Now().Unix(); reset <= now-1 || reset > now+61 {
		t.Errorf("X-RateLimit-Reset %d is not within the window from now (%d)", reset, now)
	}
	m := r.json(t)
	if m["allowed"] != false || num(t, m, "retry_after") < 1 {
		t.Errorf("decision fields: %s", r.body)
	}
	if r.errorCode(t) != "RATE_LIMIT_EXCEEDED" {
		t.Errorf("code %s", r.errorCode(t))
	}
	details := m["error"].(map[string]any)["details"].(map[string]any)
	if num(t, details, "limit") != 2 || num(t, details, "window_seconds") != 60 || num(t, details, "retry_after_seconds") < 1 {
		t.Errorf("details %v", details)
	}
	if _, err := time.Parse(time.RFC3339, fmt.Sprint(details["reset_at"])); err != nil {
		t.Errorf("details.reset_at %v is not RFC 3339", details["reset_at"])
	}
}

// 200 concurrent checks against a limit of 100 admit exactly 100, for every
// algorithm, through the whole HTTP service.
func TestExactnessUnderConcurrency(t *testing.T) {
	for _, mode := range []struct {
		name string
		env  map[string]string
	}{{"redis", nil}, {"in_memory", inMemory}} {
		t.Run(mode.name, func(t *testing.T) { exactUnderConcurrency(t, startService(t, "", mode.env)) })
	}
}

func exactUnderConcurrency(t *testing.T, s *service) {
	for _, a := range rules.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			req := map[string]any{"user_id": "conc-" + string(a), "endpoint": "/x", "limit": 100, "window_seconds": 3600, "strategy": string(a)}
			codes := make(chan int, 200)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := 0; i < 200; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					codes <- s.checkStatus(req)
				}()
			}
			close(start)
			wg.Wait()
			close(codes)
			n := map[int]int{}
			for c := range codes {
				n[c]++
			}
			if n[200] != 100 || n[429] != 100 {
				t.Fatalf("statuses %v; want exactly 100 x 200 and 100 x 429", n)
			}
		})
	}
}

// A bucket's lease handed back once the bucket is full again credits
// nothing: the tokens would come back on top of the refill the bucket's cap
// cut (an outsider banked leases on 40 paths, waited, drained the bucket
// and touched the paths: 201 admitted in a burst of 100): its leased_at
// is from before the bucket was full again.
func TestBucketLeaseHandBackAfterRefill(t *testing.T) {
	s := startService(t, "[lease]\nfraction = 0.5\nmax = 20\n\n[[tiers]]\nname = \"free\"\nlimit = 20\nwindow_seconds = 4\nalgorithm = \"token_bucket\"\nper_endpoint = false\n", nil)
	check := func(extra map[string]any) map[string]any {
		body := map[string]any{"user_id": "banker", "endpoint": "/x"}
		for k, v := range extra {
			body[k] = v
		}
		return s.check(body).json(t)
	}
	leasedAt := time.Now()
	m := check(map[string]any{"lease": 20})
	granted := num(t, m["lease"].(map[string]any), "granted")
	stamp, _ := m["lease"].(map[string]any)["leased_at"].(float64) // absent: a new bucket was never anything but full
	// 19 left after the request; half of it, 9, leased: 10 left, full
	// again at 5 a second in two seconds.
	if granted != 9 || num(t, m, "remaining") != 10 {
		t.Fatalf("lease: %v", m)
	}
	for i := 0; time.Since(leasedAt) < 2100*time.Millisecond; i++ {
		if i == 400 {
			t.Fatal("the clock did not get there")
		}
		time.Sleep(10 * time.Millisecond) // the clock is the signal: Redis runs on this host
	}
	for i := 0; check(nil)["allowed"] == true; i++ {
		if i == 40 {
			t.Fatal("the bucket never ran dry")
		}
	}
	// Credited, the 9 would leave 8 or more; the refill while this runs
	// is a token or two.
	if m = check(map[string]any{"returned": granted, "leased_at": int64(stamp)}); num(t, m, "remaining") >= 5 {
		t.Fatalf("after the late hand-back: %v; want the drained bucket's few refilled tokens, nothing credited", m)
	}
}

func TestLeaseAndReturn(t *testing.T) {
	s := startService(t, "[lease]\nfraction = 0.5\nmax = 20\nttl_ms = 800\n", nil)
	// The free tier counts the path and the tier's total: a lease over two
	// counters starts on a path's second call (its first leases nothing).
	m := s.check(map[string]any{"user_id": "leaser", "endpoint": "/x", "lease": 1000}).json(t)
	if lease := m["lease"].(map[string]any); num(t, lease, "granted") != 0 || num(t, m, "remaining") != 99 {
		t.Fatalf("a path's first lease: %v", m)
	}
	m = s.check(map[string]any{"user_id": "leaser", "endpoint": "/x", "lease": 1000}).json(t)
	lease := m["lease"].(map[string]any)
	// The free tier has 100; 98 left after the costs; half of it, capped at 20.
	if num(t, lease, "granted") != 20 || num(t, lease, "ttl_ms") != 800 || num(t, m, "remaining") != 78 {
		t.Fatalf("lease: %v", m)
	}
	stamp, _ := lease["leased_at"].(float64) // absent: the tier's buckets are new, never anything but full
	m = s.check(map[string]any{"user_id": "leaser", "endpoint": "/x", "returned": 20, "leased_at": int64(stamp)}).json(t)
	if num(t, m, "remaining") != 97 {
		t.Fatalf("after returning 20: %v; want 97 remaining", m)
	}
}

func TestPenaltiesLengthenTheWait(t *testing.T) {
	s := startService(t, "[penalties]\nenabled = true\nviolation_threshold = 1\nmultipliers = [4]\n", nil)
	// A token bucket refilling 1 an hour: its wait is an hour whenever the
	// test runs (a fixed window's would end at the next hour's edge, which
	// the two checks could straddle).
	req := map[string]any{"user_id": "abuser", "endpoint": "/x", "limit": 1, "window_seconds": 3600, "strategy": "token_bucket"}
	s.check(req)
	r := s.check(req)
	if r.status != 429 {
		t.Fatal(r.status)
	}
	// Without the penalty the wait would be the hour's refill; and
	// reset_at names the penalised wait's end, not the refill's.
	m := r.json(t)
	now := time.Now().Unix()
	const plain = 3600
	retry := num(t, m, "retry_after")
	if retry < 3*plain || retry > 4*plain+4 {
		t.Fatalf("retry_after %d; want about 4 x %d", retry, plain)
	}
	if reset := num(t, m, "reset_at"); reset < now+retry-1 {
		t.Fatalf("reset_at %d is before the penalised retry (%d + %d)", reset, now, retry)
	}
	if metricValue(t, s, `tollgate_penalty_denials_total`) != 1 {
		t.Fatal("penalty not counted")
	}
}

func TestExemptions(t *testing.T) {
	s := startService(t, "[exemptions]\nips = [\"10.0.0.0/8\"]\nusers = [\"ops\"]\n", nil)
	for _, id := range []string{"ip:10.1.2.3", "ops", "user:ops"} {
		for i := 0; i < 3; i++ {
			r := s.check(map[string]any{"user_id": id, "endpoint": "/x", "limit": 1, "window_seconds": 60})
			if r.status != 200 || r.json(t)["rule_id"] != "exempt" {
				t.Fatalf("%s: %d %s", id, r.status, r.body)
			}
		}
	}
	if n := s.dbsize(); n != 0 {
		t.Fatalf("exempt callers wrote %d keys", n)
	}
	if r := s.check(map[string]any{"user_id": "ip:11.1.2.3", "endpoint": "/x"}); r.json(t)["rule_id"] == "exempt" {
		t.Fatal("an address outside the exempt prefix was exempt")
	}
}

func TestRulesScopesAndMostRestrictive(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, `
[[rules]]
id = "per-user"
scope = "user"
algorithm = "fixed_window"
limit = 5
window_seconds = 60

[[rules]]
id = "everyone"
scope = "global"
algorithm = "fixed_window"
limit = 3
window_seconds = 60
`, nil)
	codes := []int{}
	for i := 0; i < 4; i++ {
		codes = append(codes, s.check(map[string]any{"user_id": fmt.Sprintf("u%d", i%2), "endpoint": "/x"}).status)
	}
	if fmt.Sprint(codes) != "[200 200 200 429]" {
		t.Fatalf("statuses %v; the global rule (3) must stop the 4th request of any user", codes)
	}
	r := s.check(map[string]any{"user_id": "u9", "endpoint": "/x"})
	if r.json(t)["rule_id"] != "everyone" {
		t.Fatalf("deciding rule %s", r.body)
	}
}

func TestLogOnlyRulePasses(t *testing.T) {
	s := startService(t, "[[rules]]\nid = \"shadow\"\nscope = \"user\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 60\naction = \"log_only\"\n", nil)
	s.check(map[string]any{"user_id": "x", "endpoint": "/x"})
	r := s.check(map[string]any{"user_id": "x", "endpoint": "/x"})
	if r.status != 200 || r.json(t)["log_only"] != true {
		t.Fatalf("log_only rule: %d %s", r.status, r.body)
	}
}

func TestBatchIdempotency(t *testing.T) {
	s := startService(t, "", nil)
	batch := map[string]any{"idempotency_key": "batch_123", "checks": []any{
		map[string]any{"user_id": "user_123", "endpoint": "/api/v1/users", "limit": 1, "window_seconds": 60},
		map[string]any{"user_id": "user_456", "endpoint": "/api/v1/posts"},
		map[string]any{"user_id": "bad\r\nid", "endpoint": "/x"},
	}}
	first := s.do("POST", "/v1/rate-limit/batch-check", batch)
	if first.status != 200 {
		t.Fatalf("%d %s", first.status, first.body)
	}
	res := first.json(t)["results"].([]any)
	if len(res) != 3 || res[0].(map[string]any)["allowed"] != true || res[2].(map[string]any)["error"] == nil {
		t.Fatalf("results %s", first.body)
	}
	// The replay answers the same without spending again: user_123's limit
	// of 1 would deny a second real check.
	again := s.do("POST", "/v1/rate-limit/batch-check", batch)
	m := again.json(t)
	if m["replayed"] != true || m["results"].([]any)[0].(map[string]any)["allowed"] != true {
		t.Fatalf("replay %s", again.body)
	}
	if ttl := s.rdb.TTL(context.Background(), firstIdemKey(t, s)).Val(); ttl <= 4*time.Minute || ttl > 5*time.Minute {
		t.Fatalf("idempotency TTL %v, want 5 minutes", ttl)
	}
	fresh := s.do("POST", "/v1/rate-limit/batch-check", map[string]any{"checks": batch["checks"]})
	if fresh.json(t)["results"].([]any)[0].(map[string]any)["allowed"] != false {
		t.Fatalf("without a key the batch must be checked again: %s", fresh.body)
	}
}

func firstIdemKey(t *testing.T, s *service) string {
	keys, err := s.rdb.Keys(context.Background(), "rl:idem:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("idempotency keys %v, %v", keys, err)
	}
	return keys[0]
}

func TestStatusDoesNotSpend(t *testing.T) {
	s := startService(t, "", nil)
	s.check(map[string]any{"user_id": "watcher", "endpoint": "/api/v1/users"})
	for i := 0; i < 3; i++ {
		r := s.do("GET", "/v1/rate-limit/status/watcher/api/v1/users", nil)
		m := r.json(t)
		if r.status != 200 || num(t, m, "remaining") != 99 || m["endpoint"] != "/api/v1/users" || m["usage_percentage"].(float64) != 1 {
			t.Fatalf("status: %d %s", r.status, r.body)
		}
	}
}

// metricValue reads one sample of /metrics by its full name with labels.
func metricValue(t *testing.T, s *service, series string) float64 {
	t.Helper()
	r := s.do("GET", "/metrics", nil)
	for _, l := range strings.Split(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", l, err)
			}
			return f
		}
	}
	return 0
}

// The numbers are also exported under the names the seed's dashboards read:
// requests by status, latency with millisecond buckets, the pool's size;
// the breakdown by endpoint is by rule (bounded), never by raw path.
func TestMetricsUnderTheSeedNames(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 3\nwindow_seconds = 60\n", nil)
	for i := 0; i < 4; i++ {
		s.check(map[string]any{"user_id": "metered", "endpoint": fmt.Sprintf("/x/%d", i%2)})
		s.check(map[string]any{"user_id": "metered", "endpoint": "/x/0"})
	}
	for series, want := range map[string]float64{
		`rate_limiter_requests_total{status="allowed"}`:                          5,
		`rate_limiter_requests_total{status="blocked"}`:                          3,
		`rate_limiter_latency_seconds_count`:                                     8,
		`tollgate_decisions_total{result="denied",rule="tier_free",tier="free"}`: 3,
	} {
		if got := metricValue(t, s, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if metricValue(t, s, "redis_connection_pool_size") < 1 {
		t.Error("redis_connection_pool_size is not exported")
	}
	if body := s.do("GET", "/metrics", nil).body; strings.Contains(string(body), `"/x/0"`) {
		t.Error("a raw path is a metric label")
	}
}
