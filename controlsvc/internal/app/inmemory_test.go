package app_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// inMemory runs a service without Redis (redis_enabled = false).
var inMemory = map[string]string{"TOLLGATE_REDIS_ENABLED": "false"}

// Without Redis, everything an operator and a caller do works as with it,
// in one process: runtime tiers and rules, API keys, overrides, resets,
// idempotent batches, usage and the audit trail. Nothing dials Redis (the
// URL points where nothing listens, and every answer is a decision).
func TestInMemoryWalkthrough(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 3\nwindow_seconds = 60\n",
		map[string]string{"TOLLGATE_REDIS_ENABLED": "false", "TOLLGATE_ADMIN_TOKEN": "ops:" + adminToken})
	ctx := context.Background()

	h := s.admin("GET", "/health", nil).json(t)
	if h["status"] != "healthy" || h["components"].(map[string]any)["redis"] != "disabled" {
		t.Fatalf("health: %v", h)
	}

	// The file's tier: exactly its limit.
	caller := map[string]any{"user_id": "alice", "endpoint": "/api/v1/items"}
	for i := 1; i <= 3; i++ {
		if r := s.check(caller); r.status != 200 {
			t.Fatalf("check %d: %d %s", i, r.status, r.body)
		}
	}
	if r := s.check(caller); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("4th check: %d %s", r.status, r.body)
	}
	// A reset forgets alice's counters.
	if r := s.admin("POST", "/v1/rate-limit/reset", map[string]any{"user_id": "alice", "endpoint": "/api/v1/items"}); r.status != 200 {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	if r := s.check(caller); r.status != 200 {
		t.Fatalf("after the reset: %d %s", r.status, r.body)
	}

	// A runtime tier and a runtime rule apply at once, and go with their
	// deletion.
	if r := s.admin("PUT", "/admin/v1/tiers/3", map[string]any{"name": "gold", "limit": 5, "window_seconds": 60}); r.status != 200 {
		t.Fatalf("tier: %d %s", r.status, r.body)
	}
	rule := s.admin("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/api/v1/search", "limit": 1, "window_seconds": 60})
	if rule.status != http.StatusCreated {
		t.Fatalf("rule: %d %s", rule.status, rule.body)
	}
	ruleID := fmt.Sprint(rule.json(t)["rule_id"])
	search := map[string]any{"user_id": "bob", "endpoint": "/api/v1/search", "tier": "gold"}
	if a, b := s.check(search).status, s.check(search).status; a != 200 || b != 429 {
		t.Fatalf("runtime rule of 1: %d then %d", a, b)
	}
	if r := s.admin("DELETE", "/admin/v1/rate-limit-rules/"+ruleID, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete rule: %d %s", r.status, r.body)
	}
	if r := s.admin("DELETE", "/admin/v1/rate-limit-rules/"+ruleID, nil); r.status != http.StatusNotFound {
		t.Fatalf("delete it again: %d %s", r.status, r.body)
	}
	if r := s.check(search); r.status != 200 || num(t, r.json(t), "limit") != 5 {
		t.Fatalf("after the rule's deletion, gold's 5: %d %s", r.status, r.body)
	}

	// API keys: issued, found, listed, revoked.
	created := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "7", "tier": "gold"})
	raw, keyID := created.json(t)["api_key"].(string), created.json(t)["key_id"].(string)
	s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "7", "tier": "free"})
	s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "8", "tier": "free"})
	withKey := map[string]any{"user_id": "ip:192.0.2.9", "endpoint": "/api/v1/items", "api_key": raw}
	if r := s.check(withKey); r.status != 200 || num(t, r.json(t), "limit") != 5 {
		t.Fatalf("check with the key: %d %s", r.status, r.body)
	}
	page := s.admin("GET", "/admin/v1/api-keys?user_id=7&limit=1", nil).json(t)
	if page["count"] != 1.0 || page["next_cursor"] == nil {
		t.Fatalf("first page of user 7's keys: %v", page)
	}
	rest := s.admin("GET", fmt.Sprintf("/admin/v1/api-keys?user_id=7&limit=5&cursor=%v", page["next_cursor"]), nil).json(t)
	if rest["count"] != 1.0 || rest["next_cursor"] != nil {
		t.Fatalf("second page of user 7's keys: %v", rest)
	}
	if all := s.admin("GET", "/admin/v1/api-keys", nil).json(t); all["count"] != 3.0 {
		t.Fatalf("every key: %v", all)
	}
	if r := s.admin("POST", "/admin/v1/api-keys/"+keyID+"/revoke", nil); r.status != 200 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if r := s.check(withKey); r.status != http.StatusForbidden {
		t.Fatalf("check with the revoked key: %d %s", r.status, r.body)
	}
	if r := s.admin("GET", "/admin/v1/api-keys?status=revoked", nil).json(t); r["count"] != 1.0 {
		t.Fatalf("revoked keys: %v", r)
	}
	if r := s.admin("GET", "/admin/v1/api-keys/k_0000000000000000", nil); r.status != http.StatusNotFound {
		t.Fatalf("unknown key id: %d %s", r.status, r.body)
	}

	// An override beats the tier, is listed, and goes.
	if r := s.admin("PUT", "/v1/rate-limit/config", map[string]any{"user_id": "carol", "endpoint": "/api/v1/items", "limit": 1, "window_seconds": 60, "strategy": "fixed_window"}); r.status != 200 {
		t.Fatalf("override: %d %s", r.status, r.body)
	}
	carol := map[string]any{"user_id": "carol", "endpoint": "/api/v1/items"}
	if a, b := s.check(carol).status, s.check(carol).status; a != 200 || b != 429 {
		t.Fatalf("override of 1: %d then %d", a, b)
	}
	if l := s.admin("GET", "/admin/v1/overrides", nil).json(t); l["total"] != 1.0 {
		t.Fatalf("overrides: %v", l)
	}
	if r := s.admin("DELETE", "/v1/rate-limit/config", map[string]any{"user_id": "carol", "endpoint": "/api/v1/items"}); r.status != http.StatusNoContent {
		t.Fatalf("delete override: %d %s", r.status, r.body)
	}
	if l := s.admin("GET", "/admin/v1/overrides", nil).json(t); l["total"] != 0.0 {
		t.Fatalf("overrides after the deletion: %v", l)
	}

	// A batch with an idempotency key is answered once and replayed.
	batch := map[string]any{"idempotency_key": "b-1", "checks": []any{map[string]any{"user_id": "dave", "endpoint": "/x", "limit": 1, "window_seconds": 60}}}
	first := s.do("POST", "/v1/rate-limit/batch-check", batch).json(t)
	again := s.do("POST", "/v1/rate-limit/batch-check", batch).json(t)
	if first["results"].([]any)[0].(map[string]any)["allowed"] != true || again["replayed"] != true ||
		again["results"].([]any)[0].(map[string]any)["allowed"] != true {
		t.Fatalf("batch %v, replay %v", first, again)
	}
	batch["checks"] = []any{map[string]any{"user_id": "dave", "endpoint": "/y"}}
	if r := s.do("POST", "/v1/rate-limit/batch-check", batch); r.status != http.StatusConflict {
		t.Fatalf("key reused for other checks: %d %s", r.status, r.body)
	}

	// Usage and the trail: alice's requests and violation, the operator's
	// changes, paged.
	if err := s.app.FlushUsage(ctx); err != nil {
		t.Fatal(err)
	}
	u := s.admin("GET", "/admin/v1/usage/alice", nil).json(t)
	day, _ := u["last_24_hours"].(map[string]any)
	if day == nil || day["total_requests"] != 4.0 || day["violations"] != 1.0 {
		t.Fatalf("alice's usage (4 admitted, 1 refused): %v", u)
	}
	var actions []string
	since := ""
	for pages := 0; ; pages++ {
		q := "/admin/v1/audit?type=admin&limit=2"
		if since != "" {
			q += "&since=" + since
		}
		p := s.admin("GET", q, nil).json(t)
		for _, e := range p["events"].([]any) {
			ev := e.(map[string]any)
			if ev["actor"] != "ops" {
				t.Fatalf("event %v: want actor ops", ev)
			}
			actions = append(actions, ev["action"].(string))
		}
		next, _ := p["next"].(string)
		if next == "" || pages > 20 {
			break
		}
		since = next
	}
	want := []string{"counters.reset", "tier.put", "rule.create", "rule.delete", "api_key.create", "api_key.create", "api_key.create", "api_key.revoke", "override.set", "override.delete"}
	if strings.Join(actions, " ") != strings.Join(want, " ") {
		t.Fatalf("the trail, paged two at a time:\n got %v\nwant %v", actions, want)
	}
	if v := s.admin("GET", "/admin/v1/audit?type=violation", nil).json(t); v["count"].(float64) < 3 {
		t.Fatalf("violations (alice, bob, carol): %v", v)
	}
	if n := s.app.Metrics(); n == nil {
		t.Fatal("no metrics")
	}
	if strings.Contains(s.logs.String(), "redis not reachable") || strings.Contains(s.logs.String(), "127.0.0.1:1") {
		t.Fatalf("the service reached for Redis:\n%s", s.logs.String())
	}
}

// Envoy's rate limit service protocol counts in memory too.
func TestInMemoryRateLimitService(t *testing.T) {
	_, c, _ := rlsService(t, rlsYAML, "", map[string]string{"TOLLGATE_REDIS_ENABLED": "false", "TOLLGATE_DECISION_TOKEN": ""})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var codes []rlspb.RateLimitResponse_Code
	for range 4 {
		r, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u1")}})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, r.OverallCode)
	}
	if fmt.Sprint(codes) != "[OK OK OK OVER_LIMIT]" {
		t.Fatalf("3 a minute: %v", codes)
	}
}
