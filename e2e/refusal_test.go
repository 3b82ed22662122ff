package e2e

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// Through the gateway, a rule's own response answers what it refuses, with
// the denial's numbers in its body, while leases are on; other rules keep
// the standard 429.
func TestRulesOwnResponseThroughTheGateway(t *testing.T) {
	windowtest.RoomInMinute(t)
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, controlConfig+`
[[rules]]
id = "reports"
path = "/api/v1/reports"
scope = "ip"
algorithm = "fixed_window"
limit = 2
window_seconds = 60
[rules.response]
status = 503
body = '{"message":"reports are busy","retry_in":{{retry_after}},"rule":"{{rule_id}}","request":"{{request_id}}"}'
headers = {x-refused-why = "reports", content-type = "application/vnd.busy+json"}
`)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":500,"lease":{"request":5}}`)
	ip := []string{"X-Forwarded-For", "203.0.113.77", "X-Request-Id", "req-77"}
	for i := range 2 {
		if res := get(t, gw, "/api/v1/reports", ip...); res.status != 200 {
			t.Fatalf("request %d: %d %s", i, res.status, res.body)
		}
	}
	for i := range 3 { // the service's denial, then the cached one
		res := get(t, gw, "/api/v1/reports", ip...)
		var body map[string]any
		if err := json.Unmarshal(res.body, &body); err != nil || res.status != 503 || body["message"] != "reports are busy" || body["rule"] != "reports" ||
			body["retry_in"] == nil || res.header.Get("X-Refused-Why") != "reports" || res.header.Get("Content-Type") != "application/vnd.busy+json" ||
			res.header.Get("Retry-After") == "" || res.header.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("refusal %d: %d %v %s", i, res.status, res.header, res.body)
		}
	}
	// The tier's own limit (3) refuses with the standard envelope.
	other := []string{"X-Forwarded-For", "203.0.113.78"}
	for range 3 {
		get(t, gw, "/api/v1/items", other...)
	}
	if res := get(t, gw, "/api/v1/items", other...); res.status != 429 {
		t.Fatalf("tier refusal: %d %s", res.status, res.body)
	}
}

// Through the gateway, a daily quota in a time zone refuses past its limit
// (leases on) and names the zone's next midnight as its reset.
func TestDailyQuotaThroughTheGateway(t *testing.T) {
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, controlConfig+`
[[rules]]
id = "daily"
path = "/api/v1/reports"
scope = "ip"
algorithm = "fixed_window"
limit = 2
period = "day"
time_zone = "America/Sao_Paulo"
`)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":500,"lease":{"request":5}}`)
	ip := []string{"X-Forwarded-For", "203.0.113.90"}
	for i := range 2 { // under the free tier's 3 a minute
		if res := get(t, gw, "/api/v1/reports", ip...); res.status != 200 {
			t.Fatalf("request %d: %d %s", i, res.status, res.body)
		}
	}
	res := get(t, gw, "/api/v1/reports", ip...)
	zone, err := time.LoadLocation("America/Sao_Paulo")
	if err != nil {
		t.Fatal(err)
	}
	n := time.Now().In(zone)
	midnight := time.Date(n.Year(), n.Month(), n.Day()+1, 0, 0, 0, 0, zone)
	if res.status != 429 || res.header.Get("X-RateLimit-Reset") != strconv.FormatInt(midnight.Unix(), 10) {
		t.Fatalf("over the daily quota: %d reset %s (want %d) %s", res.status, res.header.Get("X-RateLimit-Reset"), midnight.Unix(), res.body)
	}
}
