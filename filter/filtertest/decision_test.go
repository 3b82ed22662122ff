package filtertest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

func TestAllowedHeadersBothWays(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"headers":{"ietf":true}}`, 1)
	s, act := e.start(req{})
	if act != wasmhost.Pause {
		t.Fatal("no pause for the callout")
	}
	if s.Resumed {
		t.Fatal("resumed before the answer")
	}
	e.answer(0, "200", decision(true, 42, 0, 0))
	if !s.Resumed || s.Local != nil {
		t.Fatalf("allowed request not resumed: %+v", s)
	}
	up := map[string]string{}
	for _, k := range []string{"x-tollgate-identity", "x-tollgate-tier", "x-tollgate-decision"} {
		up[k] = s.RequestHeaders.Value(k)
	}
	if !reflect.DeepEqual(up, map[string]string{"x-tollgate-identity": "user:alice", "x-tollgate-tier": "free", "x-tollgate-decision": "allowed"}) {
		t.Fatalf("upstream headers %v", up)
	}
	got := respond(t, s)
	want := wasmhost.Headers{{":status", "200"}, {"content-type", "text/plain"},
		{"x-ratelimit-limit", "100"}, {"x-ratelimit-remaining", "42"}, {"x-ratelimit-reset", strconv.FormatInt(epoch.Unix()+60, 10)},
		{"x-ratelimit-window", "60"}, {"x-ratelimit-strategy", "token_bucket"}, {"ratelimit-policy", `"tier_free";q=100;w=60`}, {"ratelimit", `"tier_free";r=42;t=60`}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("response headers\n got %v\nwant %v", got, want)
	}
	if n := len(e.host.Histogram("tollgate_callout_latency_ms")); n != 1 {
		t.Fatalf("%d callout latency samples, want 1", n)
	}
}

// headers.prefix names the X-RateLimit fields.
func TestHeaderPrefix(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"headers":{"prefix":"X-Quota-"}}`, 1)
	s, _ := e.start(req{})
	e.answer(0, "200", decision(true, 42, 0, 0))
	got := respond(t, s)
	if got.Value("x-quota-limit") != "100" || got.Value("x-quota-remaining") != "42" || got.Value("x-quota-strategy") != "token_bucket" || got.Value("x-ratelimit-limit") != "" {
		t.Fatalf("headers %v", got)
	}
}

func TestXRateLimitCanBeTurnedOff(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"headers":{"x_ratelimit":false}}`, 1)
	s, _ := e.start(req{})
	e.answer(0, "200", decision(true, 42, 0, 0))
	if got := respond(t, s); len(got) != 2 {
		t.Fatalf("headers %v; want none added", got)
	}
}

func TestDeniedLocal429(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":5},"headers":{"ietf":true}}`, 1)
	s, _ := e.start(req{})
	e.answer(0, "429", decision(false, 0, 0, 17))
	if s.Resumed || s.Local == nil || s.Local.Status != 429 {
		t.Fatalf("denied: resumed %v local %+v", s.Resumed, s.Local)
	}
	h := s.Local.Headers
	for k, v := range map[string]string{"retry-after": "17", "x-ratelimit-limit": "100", "x-ratelimit-remaining": "0",
		"x-ratelimit-reset": strconv.FormatInt(epoch.Unix()+60, 10), "content-type": "application/json", "x-ratelimit-strategy": "token_bucket",
		"ratelimit": `"tier_free";r=0;t=17`, "ratelimit-policy": `"tier_free";q=100;w=60`} {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("429 header %s = %v, want exactly %q", k, got, v)
		}
	}
	body := mustJSON(t, s.Local.Body)["error"].(map[string]any)
	details := body["details"].(map[string]any)
	if body["code"] != "RATE_LIMIT_EXCEEDED" || body["message"] != "You have exceeded the rate limit of 100 requests per minute" ||
		details["limit"] != 100.0 || details["window_seconds"] != 60.0 || details["retry_after_seconds"] != 17.0 ||
		details["reset_at"] != time.Unix(epoch.Unix()+60, 0).UTC().Format(time.RFC3339) {
		t.Fatalf("429 body %s", s.Local.Body)
	}
	// The denial is answered from the cache for a second at most, with
	// the service's wait counting down: no callout meanwhile.
	e.clock.Advance(600 * time.Millisecond)
	s, act := e.start(req{})
	if act != wasmhost.Pause || s.Local == nil || s.Local.Status != 429 || s.Local.Headers.Value("retry-after") != "17" ||
		s.Local.Headers.Value("x-ratelimit-strategy") != "token_bucket" {
		t.Fatalf("cached denial: %v %+v", act, s.Local)
	}
	e.noCallout(0)
	// Then the service is asked again (a reset, a raised override or a
	// key's new tier reaches this client within a second).
	e.clock.Advance(500 * time.Millisecond)
	e.start(req{})
	e.answer(0, "429", decision(false, 0, 0, 16))
	e.clock.Advance(900 * time.Millisecond)
	if s, _ := e.start(req{}); s.Local == nil || s.Local.Headers.Value("retry-after") != "16" {
		t.Fatalf("denial cached again: %+v", s.Local)
	}
	e.noCallout(0)
	e.clock.Advance(200 * time.Millisecond)
	e.start(req{})
	e.answer(0, "200", decision(true, 0, 5, 0))       // reset: admitted at once
	if e.host.Counter("tollgate_denied_total") != 4 { // two from the service, two from the cache
		t.Fatalf("denied counter %d", e.host.Counter("tollgate_denied_total"))
	}
}

// A lease is spent locally, token by token, by every VM of the plugin, and
// never beyond what was granted; then the filter asks again, once: the
// other VM waits for that refill and takes from the lease it brings.
func TestLeaseSharedAcrossVMs(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10,"slots":64}}`, 3)
	e.start(req{vm: 0})
	e.answer(0, "200", decision(true, 50, 4, 0))
	hits := 0
	var paused []*wasmhost.Stream
	for i := 0; i < 6; i++ {
		s, act := e.start(req{vm: i % 3})
		if act == wasmhost.Continue {
			hits++
			if s.RequestHeaders.Value("x-tollgate-decision") != "allowed" || s.RequestHeaders.Value("x-tollgate-identity") != "user:alice" {
				t.Fatalf("local hit upstream headers %v", s.RequestHeaders)
			}
			if got := respond(t, s).Value("x-ratelimit-remaining"); got != fmt.Sprint(50+4-hits) {
				t.Fatalf("remaining on local hit %d: %s", hits, got)
			}
		} else {
			paused = append(paused, s)
		}
	}
	if hits != 4 || len(paused) != 2 {
		t.Fatalf("%d local hits from a lease of 4, %d paused", hits, len(paused))
	}
	if e.host.Counter("tollgate_lease_hits_total") != 4 {
		t.Fatalf("lease hits counter %d", e.host.Counter("tollgate_lease_hits_total"))
	}
	// VM 1 fell through to a callout; VM 2 waits for it.
	if n := len(e.vms[1].PendingCallouts()) + len(e.vms[2].PendingCallouts()); n != 1 {
		t.Fatalf("%d callouts after the lease ran out, want 1", n)
	}
	if e.vms[2].TickPeriod() != time.Millisecond {
		t.Fatalf("the waiting VM ticks every %v, want 1ms", e.vms[2].TickPeriod())
	}
	e.answer(1, "200", decision(true, 40, 4, 0))
	if !paused[0].Resumed {
		t.Fatal("the request that called out was not resumed")
	}
	if err := e.vms[2].Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if !paused[1].Resumed || paused[1].RequestHeaders.Value("x-tollgate-decision") != "allowed" {
		t.Fatal("the other VM's request did not take from the refill's lease")
	}
	if e.vms[2].TickPeriod() != 0 {
		t.Fatalf("the tick runs on with nothing waiting: %v", e.vms[2].TickPeriod())
	}
	if e.host.Counter("tollgate_lease_hits_total") != 5 {
		t.Fatalf("lease hits counter %d", e.host.Counter("tollgate_lease_hits_total"))
	}
}

// An expired lease is not spent; its tokens go back as returned with the next check.
func TestExpiredLeaseIsReturned(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 1)
	e.start(req{})
	e.answer(0, "200", decision(true, 50, 5, 0))
	e.start(req{}) // one local hit
	e.clock.Advance(1500 * time.Millisecond)
	_, act := e.start(req{})
	if act != wasmhost.Pause {
		t.Fatal("an expired lease was spent")
	}
	if _, body := e.callout(0); body.Returned != 4 {
		t.Fatalf("returned %d, want the 4 unspent tokens", body.Returned)
	}
}

// A lease's TTL counts from when its check was sent, not from the answer:
// the service measured the TTL (up to a window's end) after the send, so an
// answer slow on its way (here 600 ms of a 1,000 ms TTL) cannot carry the
// lease past the end the service meant.
func TestLeaseTTLCountsFromTheSend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		advance time.Duration // after the answer
		spent   bool
	}{
		{"inside the TTL from the send", 399 * time.Millisecond, true},
		{"at the TTL from the send", 400 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 1)
			e.start(req{})
			e.clock.Advance(600 * time.Millisecond) // the answer's way back
			e.answer(0, "200", decision(true, 50, 5, 0))
			e.clock.Advance(tc.advance)
			if _, act := e.start(req{}); (act == wasmhost.Continue) != tc.spent {
				t.Fatalf("%v after the answer (%v after the send, TTL 1s): lease spent %v, want %v",
					tc.advance, 600*time.Millisecond+tc.advance, act == wasmhost.Continue, tc.spent)
			}
		})
	}
}

// Different callers and paths never share a lease.
func TestLeaseIsPerBucket(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 1)
	e.start(req{source: "192.0.2.1:1"})
	e.answer(0, "200", decision(true, 50, 5, 0))
	for _, r := range []req{{source: "192.0.2.2:1"}, {source: "192.0.2.1:1", path: "/other"}, {source: "192.0.2.1:1", method: "POST"}} {
		_, act := e.start(r)
		if act != wasmhost.Pause {
			t.Fatalf("%+v used another bucket's lease", r)
		}
		c, _ := e.callout(0)
		e.vms[0].Fail(context.Background(), c.Token)
	}
}

// Two VMs' callouts for one caller are in flight; one comes back with a
// lease, the other refused: the refused request is served from the lease it
// can now see, and the cached denial does not waste the rest.
func TestRefusedCalloutUsesConcurrentLease(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10}}`, 2)
	_, act0 := e.start(req{vm: 0})
	// The first callout's refill mark ran out (a callout as slow as its
	// timeout): the second VM calls out too.
	e.clock.Advance(200 * time.Millisecond)
	s1, act1 := e.start(req{vm: 1})
	if act0 != wasmhost.Pause || act1 != wasmhost.Pause {
		t.Fatal("both requests must call out")
	}
	e.answer(0, "200", decision(true, 0, 2, 0))
	e.answer(1, "429", decision(false, 0, 0, 30))
	if s1.Local != nil || !s1.Resumed {
		t.Fatalf("refused callout with a live lease: local %+v", s1.Local)
	}
	s, act := e.start(req{vm: 1})
	if act != wasmhost.Continue || s.Local != nil {
		t.Fatal("the lease's last token was not spent")
	}
	s, _ = e.start(req{vm: 0})
	if s.Local == nil || s.Local.Status != 429 {
		t.Fatal("the cached denial was not honoured after the lease ran out")
	}
	e.noCallout(0)
}

// Under a burst the limit is the bucket and the quota the sustained rate:
// X-RateLimit-Limit is the bucket, RateLimit-Policy and the 429 message the
// quota, fresh from the service and from the cached denial alike.
func TestBurstQuotaBothWays(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":5},"headers":{"ietf":true}}`, 1)
	burst := func(allowed bool, remaining, retry int64) string {
		d := wire.CheckResponse{Allowed: allowed, Limit: 9, Quota: 3, Remaining: remaining, ResetAt: epoch.Unix() + 60, RetryAfter: retry,
			Strategy: "token_bucket", WindowSeconds: 60, RuleID: "tier_free", Identity: "user:alice", Tier: "free"}
		b, _ := json.Marshal(d)
		return string(b)
	}
	s, _ := e.start(req{})
	e.answer(0, "200", burst(true, 8, 0))
	if h := respond(t, s); h.Value("x-ratelimit-limit") != "9" || h.Value("ratelimit-policy") != `"tier_free";q=3;w=60` {
		t.Fatalf("allowed under a burst: %v", h)
	}
	for _, fresh := range []bool{true, false} {
		s, _ = e.start(req{})
		if fresh {
			e.answer(0, "429", burst(false, 0, 20))
		}
		if s.Local == nil || s.Local.Status != 429 || s.Local.Headers.Value("ratelimit-policy") != `"tier_free";q=3;w=60` ||
			!strings.Contains(string(s.Local.Body), "rate limit of 3 requests per minute") {
			t.Fatalf("denied (fresh %v): %+v", fresh, s.Local)
		}
	}
}

// A rule's own response answers its denials, fresh and cached, in every VM
// of the proxy: its status, its body rendered with the denial's numbers
// and the request's id, its headers, and the rate-limit fields it cannot
// override. A refusal that would not pass the service's checks is never
// sent: the standard 429 answers instead.
func TestDeniedWithTheRulesOwnResponse(t *testing.T) {
	denial := func(r *rules.Response) string {
		d := wire.CheckResponse{Allowed: false, Limit: 100, Remaining: 0, ResetAt: epoch.Unix() + 60, RetryAfter: 17, Strategy: "gcra",
			WindowSeconds: 60, RuleID: "llm_budget", Identity: "user:alice", Tier: "free", Refusal: r}
		return string(wire.AppendCheckResponse(nil, &d))
	}
	custom := &rules.Response{Status: 403, Body: `{"error":"budget","limit":{{limit}},"retry":{{retry_after}},"rule":"{{rule_id}}","id":"{{request_id}}"}`,
		Headers: map[string]string{"x-why": "quota", "content-type": "application/problem+json"}}
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":5}}`, 2)
	s, _ := e.start(req{headers: wasmhost.Headers{{"x-request-id", "req-1"}}})
	e.answer(0, "429", denial(custom))
	check := func(what string, s *wasmhost.Stream) {
		t.Helper()
		if s.Local == nil || s.Local.Status != 403 {
			t.Fatalf("%s: %+v", what, s.Local)
		}
		h := s.Local.Headers
		for k, v := range map[string]string{"x-why": "quota", "content-type": "application/problem+json", "retry-after": "17", "x-ratelimit-remaining": "0"} {
			if got := h.Values(k); len(got) != 1 || got[0] != v {
				t.Errorf("%s: header %s = %v, want exactly %q", what, k, got, v)
			}
		}
		b := mustJSON(t, s.Local.Body)
		if b["error"] != "budget" || b["limit"] != 100.0 || b["retry"] != 17.0 || b["rule"] != "llm_budget" || b["id"] != "req-1" {
			t.Fatalf("%s: body %s", what, s.Local.Body)
		}
	}
	check("fresh denial", s)
	s, _ = e.start(req{vm: 1, headers: wasmhost.Headers{{"x-request-id", "req-1"}}})
	e.noCallout(1)
	check("cached denial in another VM", s)

	// A refusal the service would have refused is not sent as it is.
	for _, bad := range []*rules.Response{{Status: 200, Body: "ok"}, {Headers: map[string]string{"content-length": "0"}}, {Body: "{{identity}}"}} {
		e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0}}`, 1)
		s, _ := e.start(req{})
		e.answer(0, "429", denial(bad))
		if s.Local == nil || s.Local.Status != 429 || !strings.Contains(string(s.Local.Body), "RATE_LIMIT_EXCEEDED") {
			t.Fatalf("bad refusal %+v answered %+v", bad, s.Local)
		}
	}
}
