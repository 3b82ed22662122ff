package e2e

import (
	"fmt"
	"testing"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// The two ways around the tier an outsider found, through the compiled
// filter with leases on: a ceiling rule of another scope on every path
// used to lift the tier (30 of 30 through a 5-per-path tier), and walking
// distinct paths of a per-endpoint tier was never limited. Now the tier
// holds beside the ceiling, and the tier's total stops the walk. Leases
// over several rules never admit beyond a counter (the upstream's count
// is the admissions').
func TestTierCannotBeWalkedAroundThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, `
[lease]
fraction = 0.5
max = 10
ttl_ms = 60000

[[tiers]]
name = "free"
limit = 5
window_seconds = 3600
algorithm = "fixed_window"
total_limit = 20

[[rules]]
id = "ceiling"
path = "/**"
scope = "ip"
algorithm = "fixed_window"
limit = 1000
window_seconds = 3600
`)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":2000,"lease":{"request":10}}`)
	admitted := func(address string, paths func(i int) string, n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			res := get(t, gw, paths(i), "X-Forwarded-For", address)
			switch res.status {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("%s: %d %s", paths(i), res.status, res.body)
			}
		}
		return ok
	}
	before := up.count()
	if got := admitted("203.0.113.10", func(int) string { return "/api/v1/items" }, 30); got > 5 || got < 4 {
		t.Errorf("one path under a 1,000 ceiling: %d of 30 admitted; the tier allows 5", got)
	}
	if got := admitted("203.0.113.11", func(i int) string { return fmt.Sprintf("/api/v1/items/%d", i) }, 60); got > 20 || got < 16 {
		t.Errorf("60 distinct paths: %d admitted; the tier's total is 20", got)
	}
	if n := up.count() - before; n > 25 {
		t.Errorf("the upstream saw %d requests; at most 25 were admitted", n)
	}
}
