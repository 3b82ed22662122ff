package filtertest

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Every shape of a failed callout, in each failure mode.
func TestCalloutFailures(t *testing.T) {
	failures := []struct {
		name    string
		cluster string // config's control cluster; "ghost" is unknown to the host
		deliver func(e *env)
	}{
		{"timeout (Envoy's 504)", "controlsvc", func(e *env) { e.answer(0, "504", "upstream request timeout") }},
		{"no healthy upstream (503)", "controlsvc", func(e *env) { e.answer(0, "503", "no healthy upstream") }},
		{"connect failure (Envoy's 503 text)", "controlsvc", func(e *env) {
			e.answer(0, "503", "upstream connect error or disconnect/reset before headers. reset reason: connection failure")
		}},
		{"implausible identity", "controlsvc", func(e *env) {
			e.answer(0, "200", strings.Replace(decision(true, 5, 0, 0), `"user:alice"`, `"user:a\r\nx: 1"`, 1))
		}},
		{"500 from the service", "controlsvc", func(e *env) { e.answer(0, "500", `{"error":{"code":"INTERNAL_ERROR"}}`) }},
		{"garbage body", "controlsvc", func(e *env) { e.answer(0, "200", "<html>not json") }},
		{"status and body disagree", "controlsvc", func(e *env) { e.answer(0, "200", decision(false, 0, 0, 1)) }},
		{"stream reset", "controlsvc", func(e *env) {
			c, _ := e.callout(0)
			e.vms[0].Fail(context.Background(), c.Token)
		}},
		{"unknown cluster", "ghost", func(e *env) {}},
	}
	for _, mode := range []string{"fail_open", "fail_closed"} {
		for _, f := range failures {
			t.Run(mode+"/"+f.name, func(t *testing.T) {
				e := newEnv(t, `{"control_cluster":"`+f.cluster+`","failure_mode":"`+mode+`","lease":{"request":0}}`, 1)
				s, act := e.start(req{headers: wasmhost.Headers{{"x-tollgate-decision", "forged"}}})
				f.deliver(e)
				if mode == "fail_open" {
					if s.Local != nil {
						t.Fatalf("fail_open answered locally: %+v", s.Local)
					}
					if f.cluster == "ghost" && act != wasmhost.Continue {
						t.Fatalf("a dispatch failure must continue at once, got %v", act)
					}
					if f.cluster != "ghost" && !s.Resumed {
						t.Fatal("fail_open did not resume the request")
					}
					if got := s.RequestHeaders.Values("x-tollgate-decision"); len(got) != 1 || got[0] != "degraded" {
						t.Fatalf("upstream decision %v, want degraded", got)
					}
					if h := respond(t, s); h.Value("x-ratelimit-limit") != "" {
						t.Fatal("a degraded answer claims a quota")
					}
					if e.host.Counter("tollgate_degraded_total") != 1 {
						t.Fatal("degraded not counted")
					}
				} else {
					if s.Resumed || s.Local == nil || s.Local.Status != 503 {
						t.Fatalf("fail_closed: resumed %v local %+v", s.Resumed, s.Local)
					}
					if code := mustJSON(t, s.Local.Body)["error"].(map[string]any)["code"]; code != "SERVICE_UNAVAILABLE" {
						t.Fatalf("503 body %s", s.Local.Body)
					}
				}
				if e.host.Counter("tollgate_callout_failures_total") != 1 {
					t.Fatalf("callout failures counted %d", e.host.Counter("tollgate_callout_failures_total"))
				}
			})
		}
	}
}

// Failing open is not failing without limit: the per-VM fallback limiter
// still stops a flood.
func TestFallbackLimiter(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"ghost","lease":{"request":0},"fallback":{"limit":3,"window_seconds":10}}`, 1)
	var codes []int
	for i := 0; i < 5; i++ {
		s, _ := e.start(req{})
		if s.Local != nil {
			codes = append(codes, s.Local.Status)
		} else {
			codes = append(codes, 200)
		}
	}
	if got := codes; got[2] != 200 || got[3] != 429 || got[4] != 429 {
		t.Fatalf("statuses %v; want 3 passes then 429", got)
	}
}

// A caller the service has just refused gets nothing from the fallback:
// an outsider flooded the service with callouts that timed out (each to a
// new path, which no lease or cached denial holds), opened the breaker and
// was admitted degraded, 400 a minute past a limit of 100. On every VM of
// the proxy: another outsider, refused on one of four VMs, got 300
// degraded from the three others' fallbacks.
func TestRefusedCallerGetsNoFallback(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"fallback":{"limit":3,"window_seconds":60}}`, 2)
	status := func(s *wasmhost.Stream) int {
		if s.Local != nil {
			return s.Local.Status
		}
		return 200
	}
	e.start(req{path: "/api/v1/a"})
	e.answer(0, "429", decision(false, 0, 0, 1))
	for i := range 3 {
		s, _ := e.start(req{path: "/api/v1/new" + strconv.Itoa(i)})
		e.answer(0, "504", "upstream request timeout")
		if got := status(s); got != 429 {
			t.Fatalf("a refused caller's request %d with the service timing out: %d, want 429", i, got)
		}
	}
	for i := range 3 {
		s, _ := e.start(req{path: "/api/v1/other" + strconv.Itoa(i), vm: 1})
		e.answer(1, "504", "upstream request timeout")
		if got := status(s); got != 429 {
			t.Fatalf("a refused caller's request %d on another VM with the service timing out: %d, want 429", i, got)
		}
	}
	// Another caller still gets the fallback.
	s, _ := e.start(req{path: "/api/v1/new", source: "198.51.100.8:1"})
	e.answer(0, "504", "upstream request timeout")
	if got := status(s); got != 200 {
		t.Fatalf("another caller with the service timing out: %d, want 200 (degraded)", got)
	}
}

// After repeated failures the breaker stops callouts; after the cooldown a
// probe goes out, and its success closes the breaker.
func TestCircuitBreaker(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"breaker":{"failures":3,"cooldown_ms":5000},"fallback":{"limit":1000}}`, 1)
	for i := 0; i < 3; i++ {
		e.start(req{})
		e.answer(0, "503", "down")
	}
	for i := 0; i < 3; i++ {
		s, act := e.start(req{})
		if act != wasmhost.Continue || s.RequestHeaders.Value("x-tollgate-decision") != "degraded" {
			t.Fatalf("open breaker: %v %v", act, s.RequestHeaders)
		}
		e.noCallout(0)
	}
	// Skipped callouts are degraded answers, not failed callouts.
	if f, d := e.host.Counter("tollgate_callout_failures_total"), e.host.Counter("tollgate_degraded_total"); f != 3 || d != 6 {
		t.Fatalf("callout failures %d, degraded %d; want 3 and 6", f, d)
	}
	e.clock.Advance(5100 * time.Millisecond)
	e.start(req{})
	e.answer(0, "503", "still down") // the probe fails: open again
	e.start(req{})
	e.noCallout(0)
	e.clock.Advance(5100 * time.Millisecond)
	s, _ := e.start(req{})
	e.answer(0, "200", decision(true, 9, 0, 0)) // the probe succeeds
	if s.RequestHeaders.Value("x-tollgate-decision") != "allowed" {
		t.Fatal("probe answer not applied")
	}
	for i := 0; i < 2; i++ {
		e.start(req{})
		e.answer(0, "200", decision(true, 8, 0, 0)) // closed: every request calls out
	}
}

// The control service's own 4xx answers (API key errors) reach the client
// as they were sent.
func TestKeyErrorsPassThrough(t *testing.T) {
	for _, tt := range []struct {
		status, body string
	}{
		{"401", `{"error":{"code":"INVALID_API_KEY","message":"The provided API key is not recognised"}}`},
		{"403", `{"error":{"code":"API_KEY_REVOKED","message":"This API key has been revoked"}}`},
		{"400", `{"error":{"code":"INVALID_API_KEY","message":"format"}}`},
	} {
		e := newEnv(t, baseConfig, 1)
		s, _ := e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_whatever"}}})
		e.answer(0, tt.status, tt.body)
		if want, _ := strconv.Atoi(tt.status); s.Resumed || s.Local == nil || s.Local.Status != want || string(s.Local.Body) != tt.body {
			t.Fatalf("%s: local %+v", tt.status, s.Local)
		}
		if e.host.Counter("tollgate_callout_failures_total") != 0 {
			t.Fatal("a judged answer counted as a failure")
		}
	}
}

// A bad plugin configuration fails the start, with a critical log naming the
// field.
func TestBadConfigRefused(t *testing.T) {
	ctx := context.Background()
	for cfg, want := range map[string]string{
		`{"failure_mode":"maybe"}`:                  "failure_mode",
		`{"method_override":"ignore"}`:              "method_override",
		`{"headers":{"prefix":"X-Tollgate-"}}`:      "headers.prefix",
		`{"headers":{"prefix":"X Rate"}}`:           "headers.prefix",
		`{"timeout_ms":0}`:                          "timeout_ms",
		`{"lease":{"slots":0}}`:                     "lease.slots",
		`{"surprise":1}`:                            "surprise",
		`{"excluded_paths":["health"]}`:             "excluded_paths[0]",
		`{"jwt":{"jwks":{"keys":[{"kty":"OKP"}]}}}`: "jwt.jwks.keys[0].kty",
		`{"timeout_ms":"fast"}`:                     "timeout_ms",
		`{`:                                         "malformed JSON",
	} {
		h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(cfg), Clusters: []string{"controlsvc"}, CompilationCache: compCache})
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.NewVM(ctx)
		h.Close(ctx)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "invalid plugin configuration") {
			t.Errorf("%s: got %v; want a refusal naming %q", cfg, err, want)
		}
	}
}

// A control service that refuses the filter's own credential (a rotated or
// missing decision_token) is a failed callout, answered by the failure mode,
// never a 401 passed to the client as if the client had been judged.
func TestRefusedCredentialIsACalloutFailure(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		status int // 0: allowed upstream as degraded
	}{{"fail_open", 0}, {"fail_closed", 503}} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newEnv(t, `{"control_cluster":"controlsvc","failure_mode":"`+tc.mode+`","lease":{"request":0}}`, 1)
			s, _ := e.start(req{})
			e.answer(0, "401", `{"error":{"code":"UNAUTHORIZED","message":"the decision API needs its service credential"}}`)
			switch {
			case tc.status == 0 && (!s.Resumed || s.RequestHeaders.Value("x-tollgate-decision") != "degraded"):
				t.Fatalf("fail_open: resumed %v, decision %q", s.Resumed, s.RequestHeaders.Value("x-tollgate-decision"))
			case tc.status != 0 && (s.Local == nil || s.Local.Status != tc.status):
				t.Fatalf("fail_closed: local %+v", s.Local)
			}
			if !hasLog(e.vms[0], "refused the filter's credential") {
				t.Fatalf("no error log: %v", e.vms[0].Logs())
			}
			// An API-key error is about the client: passed through as sent.
			s, _ = e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_x"}}})
			e.answer(0, "401", `{"error":{"code":"INVALID_API_KEY","message":"unknown key"}}`)
			if s.Local == nil || s.Local.Status != 401 || !strings.Contains(string(s.Local.Body), "INVALID_API_KEY") {
				t.Fatalf("api key error: %+v", s.Local)
			}
		})
	}
}

// Envoy delivers a callout's answer even after its stream ended (the client
// went away): the lease it brought is kept for the next request, and the
// breaker hears of success and failure alike.
func TestLateAnswersKeepLeaseAndBreakerOutcome(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":5},"breaker":{"failures":2,"cooldown_ms":60000}}`, 1)
	s, _ := e.start(req{})
	if err := s.Done(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.answer(0, "200", decision(true, 50, 5, 0)) // arrives after the stream ended
	for i := 0; i < 5; i++ {
		if _, act := e.start(req{}); act != wasmhost.Continue {
			t.Fatalf("request %d: the late lease was lost", i)
		}
	}
	e.noCallout(0)
	// Two late failures open the breaker: the next request is answered by
	// the failure mode without a callout.
	for i := 0; i < 2; i++ {
		s, _ := e.start(req{})
		c, _ := e.callout(0)
		s.Done(context.Background())
		if err := e.vms[0].Fail(context.Background(), c.Token); err != nil {
			t.Fatal(err)
		}
	}
	s, act := e.start(req{})
	e.noCallout(0)
	if act != wasmhost.Continue || s.RequestHeaders.Value("x-tollgate-decision") != "degraded" {
		t.Fatalf("after two late failures: %v %q; want the open breaker's degraded answer", act, s.RequestHeaders.Value("x-tollgate-decision"))
	}
	if n := e.host.Counter("tollgate_callout_failures_total"); n != 2 {
		t.Fatalf("callout failures %d", n)
	}
}

// The service's own client errors reach the client with their headers.
func TestServiceClientErrorsKeepTheirHeaders(t *testing.T) {
	e := newEnv(t, baseConfig, 1)
	s, _ := e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_x"}}})
	c, _ := e.callout(0)
	err := e.vms[0].Respond(context.Background(), c.Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{
		{":status", "401"}, {"content-type", "application/json"}, {"www-authenticate", `ApiKey realm="api"`},
		{"content-length", "60"}, {"x-request-id", "internal"}}, Body: []byte(`{"error":{"code":"INVALID_API_KEY","message":"unknown key"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	if s.Local == nil || s.Local.Status != 401 || s.Local.Headers.Value("www-authenticate") != `ApiKey realm="api"` ||
		s.Local.Headers.Value("content-type") != "application/json" {
		t.Fatalf("local answer %+v", s.Local)
	}
	if _, ok := s.Local.Headers.Get("x-request-id"); ok {
		t.Fatal("the service's internal request id reached the client")
	}
}

// The service's failure mode is the one source of truth when it answers: its
// fail_closed 503 reaches the client even through a fail_open filter, and
// its fail_open (degraded) answer passes without rate-limit numbers, which
// nothing counted.
func TestServiceFailureModeDecides(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","failure_mode":"fail_open","lease":{"request":0}}`, 1)
	s, _ := e.start(req{})
	e.answer(0, "503", `{"error":{"code":"SERVICE_UNAVAILABLE","message":"rate limiter unavailable","details":{"failure_mode":"fail_closed"}}}`)
	if s.Resumed || s.Local == nil || s.Local.Status != 503 || !strings.Contains(string(s.Local.Body), "fail_closed") {
		t.Fatalf("the service's fail_closed answer: resumed %v local %+v", s.Resumed, s.Local)
	}
	if n := e.host.Counter("tollgate_callout_failures_total"); n != 0 {
		t.Fatalf("an answer of the service counted as a failed callout (%d)", n)
	}
	s, _ = e.start(req{})
	e.answer(0, "200", `{"allowed":true,"limit":0,"remaining":0,"reset_at":0,"retry_after":0,"strategy":"token_bucket","window_seconds":60,"rule_id":"tier_free","lease":{"granted":0,"ttl_ms":0},"identity":"user:alice","degraded":true}`)
	if !s.Resumed || s.RequestHeaders.Value("x-tollgate-decision") != "degraded" {
		t.Fatalf("degraded answer: resumed %v decision %q", s.Resumed, s.RequestHeaders.Value("x-tollgate-decision"))
	}
	if h := respond(t, s); h.Value("x-ratelimit-remaining") != "" || h.Value("x-ratelimit-reset") != "" || h.Value("x-ratelimit-limit") != "" {
		t.Fatalf("a degraded answer sent rate-limit numbers: %v", h)
	}
}

// The filter reads what the service's error answers mean from the
// envelope's fields, never from its text: a 503 whose nested values spell
// the fail_closed fields is a failed callout (the filter's own mode
// applies), and a key's refusal with a nested "code":"FORBIDDEN" is still
// the client's answer, not a refused credential.
func TestServiceAnswersAreReadByField(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","failure_mode":"fail_open","lease":{"request":0}}`, 1)
	s, _ := e.start(req{})
	e.answer(0, "503", `{"error":{"code":"INTERNAL_ERROR","message":"m","details":{"code":"SERVICE_UNAVAILABLE","failure_mode":"fail_open"},"request_id":{"code":"SERVICE_UNAVAILABLE","failure_mode":"fail_closed"}}}`)
	if !s.Resumed || s.Local != nil || s.RequestHeaders.Value("x-tollgate-decision") != "degraded" {
		t.Fatalf("a 503 mentioning fail_closed: resumed %v local %+v", s.Resumed, s.Local)
	}
	if n := e.host.Counter("tollgate_callout_failures_total"); n != 1 {
		t.Fatalf("callout failures %d, want 1", n)
	}
	s, _ = e.start(req{})
	e.answer(0, "403", `{"error":{"code":"API_KEY_REVOKED","message":"m","details":{"code":"FORBIDDEN","revoked_at":"2030-01-01T00:00:00Z"}}}`)
	if s.Resumed || s.Local == nil || s.Local.Status != 403 || !strings.Contains(string(s.Local.Body), "API_KEY_REVOKED") {
		t.Fatalf("a key's refusal mentioning FORBIDDEN: resumed %v local %+v", s.Resumed, s.Local)
	}
}

// The filter's own answers quote the proxy's x-request-id in their bodies,
// as the service's do: its 429, its fail_closed 503 and its 400s.
func TestLocalAnswersQuoteTheRequestID(t *testing.T) {
	id := wasmhost.Headers{{"x-request-id", "5f0c6a1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b"}}
	closed := newEnv(t, `{"control_cluster":"nowhere","failure_mode":"fail_closed","lease":{"request":0}}`, 1)
	s, _ := closed.start(req{headers: id})
	open := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0}}`, 1)
	d, _ := open.start(req{headers: id})
	open.answer(0, "429", decision(false, 0, 0, 5))
	b, _ := open.start(req{method: "post", headers: id})
	for name, st := range map[string]*wasmhost.Stream{"503": s, "429": d, "400": b} {
		if st.Local == nil {
			t.Fatalf("%s: no local answer", name)
		}
		if got := mustJSON(t, st.Local.Body)["error"].(map[string]any)["request_id"]; got != id[0][1] {
			t.Errorf("%s body quotes request_id %v: %s", name, got, st.Local.Body)
		}
	}
}

// While the control service cannot be asked, each caller is limited at
// fallback.share of the limit the proxy last saw for it, counted across the
// proxy's VMs (in the window of that decision, at the share of what it
// left: not a whole share on top of what the window admitted); a caller
// that had nothing left stays refused until its reset; a caller never seen
// gets the configured fallback limit.
func TestFallbackUsesLastKnownLimit(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"breaker":{"failures":3,"cooldown_ms":600000},"fallback":{"share":0.5,"limit":2,"window_seconds":60}}`, 2)
	premium, atLimit, stranger := "198.51.100.1:1000", "198.51.100.2:1000", "198.51.100.3:1000"
	seen := func(source string, limit, remaining int64) {
		t.Helper()
		s, _ := e.start(req{source: source})
		b, _ := json.Marshal(wire.CheckResponse{Allowed: true, Limit: limit, Remaining: remaining, ResetAt: epoch.Unix() + 60,
			WindowSeconds: 60, Strategy: "fixed_window", RuleID: "tier_x", Identity: "ip:" + strings.Split(source, ":")[0], Tier: "x"})
		e.answer(0, "200", string(b))
		if s.Local != nil {
			t.Fatalf("%s refused while the service answered", source)
		}
	}
	seen(premium, 1000, 900)
	seen(atLimit, 100, 0)
	// The service goes away: the breaker opens after three failed callouts.
	status := func(vm int, source string) int {
		t.Helper()
		s, _ := e.start(req{source: source, vm: vm})
		if len(e.vms[vm].PendingCallouts()) == 1 {
			e.answer(vm, "503", "down")
		}
		if s.Local != nil {
			return s.Local.Status
		}
		if d := s.RequestHeaders.Value("x-tollgate-decision"); d != "degraded" {
			t.Fatalf("%s let through as %q during the outage", source, d)
		}
		return 200
	}
	// premium: half of the 900 its window had left, over both VMs, then
	// refused until its reset.
	for i := 0; i < 450; i++ {
		if got := status(i%2, premium); got != 200 {
			t.Fatalf("premium request %d during the outage: %d", i, got)
		}
	}
	if got := status(1, premium); got != 429 {
		t.Fatalf("premium's 451st request in the window: %d, want 429", got)
	}
	// atLimit had nothing left: refused until its window resets.
	if got := status(0, atLimit); got != 429 {
		t.Fatalf("a caller at its limit: %d, want 429", got)
	}
	// A stranger: the configured 2 a minute (per VM).
	for i, want := range []int{200, 200, 429} {
		if got := status(0, stranger); got != want {
			t.Fatalf("stranger request %d: %d, want %d", i, got, want)
		}
	}
	// The next window: premium is served again, at half its limit (500),
	// atLimit too.
	e.clock.Advance(60 * time.Second)
	for i := 0; i < 500; i++ {
		if got := status(i%2, premium); got != 200 {
			t.Fatalf("premium request %d in the next window: %d", i, got)
		}
	}
	if got := status(0, premium); got != 429 {
		t.Fatalf("premium's 501st request in the next window: %d, want 429", got)
	}
	if got := status(1, atLimit); got != 200 {
		t.Fatalf("atLimit after its reset: %d", got)
	}
}

// A bucket is one path (and method) of a caller: during an outage all of a
// caller's buckets together pass at most its largest bucket's share, scaled
// to the fallback window, per VM (or fallback.limit when that is more).
// Without that bound an outsider's attack had the proxy see 90 paths per
// window (within the tier's total of 100 per 10 s), then got each path's
// share: 7,815 requests in a second.
func TestFallbackBoundsACallerAcrossItsPaths(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":0},"breaker":{"failures":3,"cooldown_ms":600000},"fallback":{"share":1,"limit":2,"window_seconds":60}}`, 1)
	const source, paths = "198.51.100.9:1000", 30
	path := func(i int) string { return "/api/v1/items/" + strconv.Itoa(i) }
	for i := range paths {
		s, _ := e.start(req{source: source, path: path(i)})
		b, _ := json.Marshal(wire.CheckResponse{Allowed: true, Limit: 20, Remaining: 19, ResetAt: epoch.Unix() + 10,
			WindowSeconds: 10, Strategy: "fixed_window", RuleID: "tier_free", Identity: "ip:198.51.100.9", Tier: "free"})
		e.answer(0, "200", string(b))
		if s.Local != nil {
			t.Fatalf("path %d refused while the service answered", i)
		}
	}
	admitted := 0
	for round := range 20 {
		for i := range paths {
			s, _ := e.start(req{source: source, path: path(i)})
			if len(e.vms[0].PendingCallouts()) == 1 {
				e.answer(0, "503", "down")
			}
			if s.Local == nil {
				admitted++
			} else if s.Local.Status != 429 {
				t.Fatalf("round %d path %d: %d", round, i, s.Local.Status)
			}
		}
	}
	// 20 a path per 10 s is 120 per 60 s: the caller's bound, where the
	// paths' shares summed to 30 x 19 = 570.
	if admitted != 120 {
		t.Fatalf("%d requests of %d paths admitted during the outage, want 120 (the caller's bound)", admitted, paths)
	}
}
