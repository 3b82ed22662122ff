package app_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// Answers that were wrong when tried from outside against the seeds, each
// kept here so it stays right.

// A bucket's remaining never exceeds the advertised limit: under a burst the
// limit is the bucket's size, and the sustained rate is the quota.
func TestLimitIsTheBucketUnderABurst(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 3\nwindow_seconds = 60\nburst = 9\n"+
		"[[tiers]]\nname = \"small\"\nlimit = 60\nwindow_seconds = 60\nburst = 3\n", nil)
	r := s.check(map[string]any{"user_id": "bursty", "endpoint": "/x"})
	if r.status != 200 {
		t.Fatalf("check: %d %s", r.status, r.body)
	}
	limit, _ := strconv.Atoi(r.header.Get("X-RateLimit-Limit"))
	remaining, _ := strconv.Atoi(r.header.Get("X-RateLimit-Remaining"))
	if limit != 9 || remaining != 8 || remaining > limit {
		t.Fatalf("X-RateLimit-Limit %d, -Remaining %d; want 9 and 8", limit, remaining)
	}
	if w := r.header.Get("X-RateLimit-Window"); w != "60" {
		t.Fatalf("X-RateLimit-Window = %q, want 60", w)
	}
	if m := r.json(t); num(t, m, "limit") != 9 || num(t, m, "quota") != 3 {
		t.Fatalf("body limit/quota: %s", r.body)
	}
	// A never-used bucket smaller than its rate is whole: 0 % used.
	st := s.do("GET", "/v1/rate-limit/status/fresh/x?tier=small", nil)
	m := st.json(t)
	if st.status != 200 || num(t, m, "limit") != 3 || num(t, m, "remaining") != 3 || m["usage_percentage"] != 0.0 {
		t.Fatalf("status of a fresh bucket: %d %s", st.status, st.body)
	}
}

// A strategy is not silently ignored: without a limit it is refused, and a
// status reads the counter of the limit it names.
func TestStrategyIsNeverIgnored(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "", nil)
	r := s.check(map[string]any{"user_id": "strat", "endpoint": "/x", "strategy": "gcra"})
	if r.status != 400 || r.errorCode(t) != "INVALID_LIMIT" {
		t.Fatalf("strategy without limit: %d %s", r.status, r.body)
	}
	own := map[string]any{"user_id": "strat", "endpoint": "/x", "strategy": "fixed_window", "limit": 5, "window_seconds": 60}
	s.check(own)
	s.check(own)
	st := s.do("GET", "/v1/rate-limit/status/strat/x?strategy=fixed_window&limit=5&window_seconds=60", nil)
	m := st.json(t)
	if st.status != 200 || m["rule_id"] != "request" || m["strategy"] != "fixed_window" || num(t, m, "remaining") != 3 {
		t.Fatalf("status of the check's own limit: %d %s", st.status, st.body)
	}
	for _, q := range []string{"?strategy=gcra", "?strategy=leaky", "?limit=x", "?colour=red", "?tier=free&tier=premium"} {
		if st := s.do("GET", "/v1/rate-limit/status/strat/x"+q, nil); st.status != 400 {
			t.Errorf("status%s: %d %s; want 400", q, st.status, st.body)
		}
	}
}

// The status of an API-key caller uses the key's tier, as its checks do.
func TestStatusOfAKeyUsesItsTier(t *testing.T) {
	s := startService(t, "", nil)
	r := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "keyholder", "tier": "premium"})
	if r.status != 201 {
		t.Fatalf("create key: %d %s", r.status, r.body)
	}
	id, _ := r.json(t)["key_id"].(string)
	st := s.do("GET", "/v1/rate-limit/status/key:"+id+"/x", nil)
	if m := st.json(t); st.status != 200 || m["tier"] != "premium" || num(t, m, "limit") != 1000 {
		t.Fatalf("status of a premium key: %d %s", st.status, st.body)
	}
}

// Every envelope has details (an object, {} when there is nothing to add),
// and a wrong method is METHOD_NOT_ALLOWED, not INVALID_INPUT.
func TestEnvelopesAreWhole(t *testing.T) {
	s := startService(t, "", nil)
	for _, tt := range []struct {
		name, method, path string
		header             []string
		status             int
		code               string
	}{
		{"no admin token", "GET", "/admin/v1/rules", []string{"Authorization", ""}, 401, "UNAUTHORIZED"},
		{"no route", "GET", "/v1/nowhere", nil, 404, "NOT_FOUND"},
		{"wrong method", "GET", "/v1/rate-limit/check", nil, 405, "METHOD_NOT_ALLOWED"},
	} {
		r := s.do(tt.method, tt.path, nil, tt.header...)
		if r.status != tt.status || r.errorCode(t) != tt.code {
			t.Errorf("%s: %d %s; want %d %s", tt.name, r.status, r.body, tt.status, tt.code)
			continue
		}
		if _, ok := r.json(t)["error"].(map[string]any)["details"].(map[string]any); !ok {
			t.Errorf("%s: envelope without a details object: %s", tt.name, r.body)
		}
	}
}

// The rule listing speaks the API's snake_case, tiers included.
func TestRuleListingIsSnakeCase(t *testing.T) {
	s := startService(t, "", nil)
	r := s.admin("GET", "/admin/v1/rules", nil)
	tiers, _ := r.json(t)["tiers"].([]any)
	if r.status != 200 || len(tiers) == 0 {
		t.Fatalf("rules: %d %s", r.status, r.body)
	}
	tier, _ := tiers[0].(map[string]any)
	if _, ok := tier["window_seconds"]; !ok || tier["Name"] != nil || tier["name"] != "free" {
		t.Fatalf("tier in the listing: %v", tier)
	}
}

// header_prefix names the X-RateLimit fields of the decision API's
// answers, as seed 001's configuration does; a prefix that is no header
// name, or the filter's own x-tollgate-, is refused.
func TestHeaderPrefix(t *testing.T) {
	s := startService(t, "", map[string]string{"TOLLGATE_HEADER_PREFIX": "X-Quota-"})
	r := s.check(map[string]any{"user_id": "u", "endpoint": "/x"})
	if r.status != 200 || r.header.Get("X-Quota-Limit") == "" || r.header.Get("X-Quota-Strategy") != "token_bucket" || r.header.Get("X-Ratelimit-Limit") != "" {
		t.Fatalf("headers %v", r.header)
	}
	for _, bad := range []string{"X-Tollgate-", "X Rate", "X-Ü-"} {
		if _, err := config.Parse(nil, func(k string) (string, bool) { return bad, k == "TOLLGATE_HEADER_PREFIX" }); err == nil || !strings.Contains(err.Error(), "header_prefix") {
			t.Errorf("prefix %q: %v", bad, err)
		}
	}
}

// shadow_mode turns refusing off without removing the filter: checks are
// decided and counted as usual, and a denial is answered as a log-only pass
// whose numbers say what would have happened.
func TestShadowModeRefusesNothing(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n", map[string]string{"TOLLGATE_SHADOW_MODE": "true"})
	for i := 0; i < 3; i++ {
		r := s.check(map[string]any{"user_id": "u", "endpoint": "/x"})
		m := r.json(t)
		if r.status != 200 || m["allowed"] != true || (i > 0) != (m["log_only"] == true) || (i > 0 && num(t, m, "remaining") != 0) {
			t.Fatalf("check %d: %d %s", i+1, r.status, r.body)
		}
	}
	if got := metricValue(t, s, `tollgate_decisions_total{result="log_only",rule="tier_free",tier="free"}`); got != 2 {
		t.Fatalf("%v log-only decisions, want the 2 that would have been denied", got)
	}
}

// enabled = false turns rate limiting off: every check is admitted as
// exempt and nothing is counted; bad input is still refused, and API keys
// are still required where they are (access control, not rate limiting).
func TestDisabledCountsNothing(t *testing.T) {
	s := startService(t, "api_key_required_paths = [\"/secure/**\"]\n[[tiers]]\nname = \"free\"\nlimit = 1\nwindow_seconds = 60\n", map[string]string{"TOLLGATE_ENABLED": "false"})
	for i := 0; i < 3; i++ {
		r := s.check(map[string]any{"user_id": "u", "endpoint": "/x"})
		m := r.json(t)
		if r.status != 200 || m["allowed"] != true || m["rule_id"] != "exempt" || m["log_only"] != nil {
			t.Fatalf("check %d: %d %s", i+1, r.status, r.body)
		}
	}
	if n := s.dbsize(); n != 0 {
		t.Fatalf("%d keys in Redis with rate limiting off", n)
	}
	if got := metricValue(t, s, `tollgate_decisions_total{result="disabled",rule="exempt",tier="free"}`); got != 3 {
		t.Fatalf("%v disabled decisions, want 3", got)
	}
	if r := s.check(map[string]any{"user_id": "a\r\nb", "endpoint": "/x"}); r.status != 400 {
		t.Fatalf("bad input with rate limiting off: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		key  string
		want int
	}{{"", http.StatusUnauthorized}, {"ak_live_bogus", http.StatusBadRequest}, {"ak_live_" + strings.Repeat("x", 43), http.StatusUnauthorized}} {
		body := map[string]any{"user_id": "ip:192.0.2.4", "endpoint": "/secure/x"}
		if tc.key != "" {
			body["api_key"] = tc.key
		}
		if r := s.check(body); r.status != tc.want {
			t.Fatalf("key %q on a key-required path with rate limiting off: %d %s", tc.key, r.status, r.body)
		}
	}
	if n := s.dbsize(); n != 0 {
		t.Fatalf("%d keys in Redis after refused keys with rate limiting off", n)
	}
}

// A throttle rule delays a refused request until its window admits it, when
// that is within throttle_max_wait_ms, instead of refusing it (real Redis
// time: the second request of a one-per-second rule waits under a second).
func TestThrottleWaitsInsteadOfRefusing(t *testing.T) {
	s := startService(t, "[[rules]]\nid = \"slow\"\npath = \"/slow\"\nscope = \"identity\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow_seconds = 1\naction = \"throttle\"\n",
		map[string]string{"TOLLGATE_THROTTLE_MAX_WAIT_MS": "1500"})
	for i := 0; i < 3; i++ {
		if r := s.check(map[string]any{"user_id": "patient", "endpoint": "/slow"}); r.status != 200 {
			t.Fatalf("request %d: %d %s; want it delayed, then admitted", i+1, r.status, r.body)
		}
	}
}
