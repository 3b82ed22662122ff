package app_test

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// The summary is the deployment's: two replicas on one Redis decide, and
// either one's summary counts every decision of both, exactly, with
// throttled + allowed == total, throttled by tier and endpoint, and the
// most refused callers.
func TestSummaryAcrossReplicas(t *testing.T) {
	r := redistest.Start(t)
	const cfg = `
[[tiers]]
name = "free"
limit = 3
window_seconds = 60
[[tiers]]
name = "premium"
limit = 100
window_seconds = 60
`
	a := startServiceOn(t, r, "redis://"+r.Addr+"/0", cfg, nil)
	b := startServiceOn(t, r, "redis://"+r.Addr+"/0", cfg, nil)
	// 5 checks of mallory on each replica (free: 3 of 10 admitted), 4 of
	// a premium caller on each (all admitted).
	for _, s := range []*service{a, b} {
		for range 5 {
			s.check(map[string]any{"user_id": "mallory", "endpoint": "/api/items"})
		}
		for range 4 {
			s.check(map[string]any{"user_id": "pam", "endpoint": "/api/orders", "tier": "premium"})
		}
	}
	ctx := context.Background()
	for _, s := range []*service{a, b} {
		if err := s.app.FlushUsage(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*service{a, b} {
		m := s.admin("GET", "/admin/v1/metrics/summary?window=5m", nil).json(t)
		total, throttled, allowed := num(t, m, "total_requests"), num(t, m, "throttled_requests"), num(t, m, "allowed_requests")
		if total != 18 || throttled != 7 || allowed != 11 || throttled+allowed != total {
			t.Fatalf("totals %d / %d / %d, want 18 / 7 / 11: %v", total, throttled, allowed, m)
		}
		if num(t, m["by_tier"].(map[string]any), "free") != 7 || num(t, m["requests_by_tier"].(map[string]any), "premium") != 8 {
			t.Fatalf("by tier: %v %v", m["by_tier"], m["requests_by_tier"])
		}
		if num(t, m["by_endpoint"].(map[string]any), "/api/items") != 7 {
			t.Fatalf("by endpoint: %v", m["by_endpoint"])
		}
		top := m["top_refused"].([]any)
		if len(top) != 1 || top[0].(map[string]any)["identity"] != "user:mallory" || num(t, top[0].(map[string]any), "refused") != 7 {
			t.Fatalf("top refused: %v", top)
		}
		series := m["series"].([]any)
		var sum int64
		for _, p := range series {
			sum += num(t, p.(map[string]any), "total")
		}
		if len(series) != 5 || sum != 18 {
			t.Fatalf("series of %d points summing %d, want 5 summing 18", len(series), sum)
		}
		if p95 := m["p95_check_latency_ms"].(float64); p95 <= 0 || p95 > 1000 {
			t.Fatalf("p95 %v", p95)
		}
	}
	// Bad windows are refused naming the field; without the admin token,
	// 401.
	if r := a.admin("GET", "/admin/v1/metrics/summary?window=7d", nil); r.status != 400 || !strings.Contains(string(r.body), "window") {
		t.Fatalf("bad window: %d %s", r.status, r.body)
	}
	if r := a.admin("GET", "/admin/v1/metrics/summary?window=5m&window=1h", nil); r.status != 400 {
		t.Fatalf("repeated window: %d %s", r.status, r.body)
	}
	if r := a.do("GET", "/admin/v1/metrics/summary", nil); r.status != 401 {
		t.Fatalf("without the admin token: %d", r.status)
	}
}

// Without Redis the summary is the one instance's.
func TestSummaryInMemory(t *testing.T) {
	s := startService(t, "", map[string]string{"TOLLGATE_REDIS_ENABLED": "false"})
	for range 3 {
		s.check(map[string]any{"user_id": "zed", "endpoint": "/x"})
	}
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := s.admin("GET", "/admin/v1/metrics/summary?window=24h", nil).json(t)
	if num(t, m, "total_requests") != 3 || len(m["series"].([]any)) != 96 {
		t.Fatalf("%v", m)
	}
}
