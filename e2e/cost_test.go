package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// Through the gateway, rules take each request's cost from the request: a
// header's tokens and a body's bytes, exactly, with leases on elsewhere; a
// bad cost header is the client's 400.
func TestCostFromTheRequestThroughTheGateway(t *testing.T) {
	windowtest.RoomInMinute(t)
	r := redistest.Start(t)
	ctl := startControl(t, r.Addr, controlConfig+`
[[rules]]
id = "llm_tokens"
path = "/v1/chat/*"
scope = "ip"
algorithm = "fixed_window"
limit = 100
window_seconds = 60
cost_from = "request_header:x-tokens"
[[rules]]
id = "upload_bytes"
path = "/upload"
scope = "ip"
algorithm = "fixed_window"
limit = 1000
window_seconds = 60
cost_from = "request_body_bytes"
`)
	up := newUpstream(t)
	gw := startGateway(t, ctl, up, `{"control_cluster":"controlsvc","decision_token":"`+decisionToken+`","timeout_ms":500,"lease":{"request":5},"cost_headers":["x-tokens"]}`)
	ip := []string{"X-Forwarded-For", "203.0.113.60"}
	for i, step := range []struct {
		tokens string
		status int
	}{{"60", 200}, {"30", 200}, {"11", 429}} {
		res := get(t, gw, "/v1/chat/completions", append(ip, "X-Tokens", step.tokens)...)
		if res.status != step.status {
			t.Fatalf("step %d (%s tokens): %d %s", i, step.tokens, res.status, res.body)
		}
	}
	if res := get(t, gw, "/v1/chat/completions", "X-Forwarded-For", "203.0.113.62", "X-Tokens", "abc"); res.status != 400 || !strings.Contains(string(res.body), "x-tokens") {
		t.Fatalf("a cost header that is no number: %d %s", res.status, res.body)
	}
	post := func(n int) int {
		req, _ := http.NewRequest(http.MethodPost, gw+"/upload", strings.NewReader(strings.Repeat("b", n)))
		req.Header.Set("X-Forwarded-For", "203.0.113.61")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if a, b := post(600), post(600); a != 200 || b != 429 {
		t.Fatalf("uploads of 600 then 600 bytes under 1000: %d, %d", a, b)
	}
}
