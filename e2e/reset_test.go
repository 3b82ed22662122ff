package e2e

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// A reset reaches a client the gateway has already refused within a second
// (the filter answers a denial from its cache for a second at most), not
// only once the denial's Retry-After (here an hour) has passed. The client
// keeps knocking meanwhile, which costs one callout a second.
func TestResetReachesARefusedClient(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, "[[tiers]]\nname = \"free\"\nlimit = 2\nwindow_seconds = 3600\nalgorithm = \"fixed_window\"\n")
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":2000,"lease":{"request":5}}`)
	const client = "203.0.113.90"
	for i, want := range []int{200, 200, 429, 429} {
		if res := get(t, gw, "/api/v1/items", "X-Forwarded-For", client); res.status != want {
			t.Fatalf("request %d: %d, want %d", i, res.status, want)
		}
	}
	ctl.admin(t, "POST", "/v1/rate-limit/reset", map[string]any{"user_id": "ip:" + client, "endpoint": "/api/v1/items"})
	reset := time.Now()
	// Bounded: the filter holds a denial for a second; a few seconds allow
	// for a busy machine.
	for deadline := reset.Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res := get(t, gw, "/api/v1/items", "X-Forwarded-For", client)
		if res.status == 200 {
			t.Logf("admitted %v after the reset", time.Since(reset).Round(10*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d %s five seconds after the reset", res.status, res.body)
		}
	}
}

// With shadow_mode nothing is refused through the gateway, and the answers
// still say what would have happened (remaining 0, decision log_only
// upstream).
func TestShadowModeThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControlEnv(t, r.Addr, "[[tiers]]\nname = \"free\"\nlimit = 2\nwindow_seconds = 60\n", "TOLLGATE_SHADOW_MODE=true")
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":2000,"lease":{"request":0}}`)
	for i := 0; i < 4; i++ {
		res := get(t, gw, "/api/v1/items", "X-Forwarded-For", "203.0.113.91")
		if res.status != 200 {
			t.Fatalf("request %d: %d %s", i+1, res.status, res.body)
		}
		if i >= 2 && up.last(t).Get("X-Tollgate-Decision") != "log_only" {
			t.Fatalf("request %d reached the upstream as %q", i+1, up.last(t).Get("X-Tollgate-Decision"))
		}
	}
}
