package filtertest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// Hostile headers neither crash the VM nor become identities.
func TestHostileHeaders(t *testing.T) {
	e := newEnv(t, jwtConfig(false), 1)
	big := strings.Repeat("A", 10_000)
	for _, h := range []wasmhost.Headers{
		{{"authorization", "Bearer " + big}},
		{{"authorization", "Bearer " + big + "." + big + "." + big}},
		{{"authorization", "Bearer {}.{}.{}"}},
		{{"x-api-key", big}},
		{{"x-api-key", "tg_}{evil\r\nx: y"}},
		{{"x-forwarded-for", big}},
		{{"x-forwarded-for", "\r\n, {{}}, 10.0.0.1"}},
	} {
		_, act := e.start(req{headers: h})
		if act != wasmhost.Pause {
			t.Fatalf("%.60v: action %v", h, act)
		}
		_, body := e.callout(0)
		if body.UserID != "ip:198.51.100.7" || len(body.APIKey) > 256 {
			t.Fatalf("%.60v: identity %q, key of %d bytes", h, body.UserID, len(body.APIKey))
		}
		e.answer(0, "200", decision(true, 1, 0, 0))
	}
	if err := e.vms[0].Broken(); err != nil {
		t.Fatal(err)
	}
}

// Each way a client might choose its identity, dodge a rule or make the
// filter work hard, against the compiled module. A row either expects a
// local answer (status and code, and no callout) or a callout that counts
// the request as wantID against wantPath.
func TestHostileRequests(t *testing.T) {
	valid := "Bearer " + keys.Sign("HS256", claims(epoch.Add(time.Hour)))
	many := wasmhost.Headers{}
	for i := range 10_000 {
		many = append(many, [2]string{"x-tollgate-f" + strconv.Itoa(i), "1"})
	}
	for _, tc := range []struct {
		name     string
		config   string
		r        req
		status   int    // a local answer, or 0 for a callout
		wantID   string // the identity the callout counts
		wantPath string
	}{
		{"two Authorization headers", jwtConfig(false), req{headers: wasmhost.Headers{{"authorization", valid}, {"authorization", "Basic YTpi"}}}, 400, "", ""},
		{"two api keys", baseConfig, req{headers: wasmhost.Headers{{"x-api-key", "tg_a"}, {"X-API-Key", "tg_b"}}}, 400, "", ""},
		{"api key and its underscore spelling", baseConfig, req{headers: wasmhost.Headers{{"x-api-key", "tg_a"}, {"x_api_key", "tg_b"}}}, 400, "", ""},
		{"client-written xff is not an identity", baseConfig, req{headers: wasmhost.Headers{{"x-forwarded-for", "10.255.0.7"}}}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"victim's address in xff", baseConfig, req{headers: wasmhost.Headers{{"x-forwarded-for", "203.0.113.50, 198.51.100.7"}}}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"forged x-real-ip", baseConfig, req{headers: wasmhost.Headers{{"x-real-ip", "203.0.113.50"}}}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"escaped letter", baseConfig, req{path: "/api/v1/%69tems"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"trailing slash", baseConfig, req{path: "/api/v1/items/"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"matrix parameter", baseConfig, req{path: "/api/v1/items;a"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		// A ';' that more path follows: Fastify 4 ends the path there, so
		// an outsider's "/api/login;/x" ran the login route counted as
		// "/api/login/x" (50 of 50 past a limit of 5). Refused, as is a
		// segment that is only a parameter ("/api/items/;x": Express runs
		// the items route with id ";x", counted as "/api/items").
		{"matrix parameter before more path", baseConfig, req{path: "/api/login;/x"}, 400, "", ""},
		{"matrix parameter before an escaped slash, read as a separator", `{"control_cluster":"controlsvc","lease":{"request":0},"escaped_slashes":"separator"}`,
			req{path: "/api/login;a%2Fx"}, 400, "", ""},
		{"segment of a parameter only", baseConfig, req{path: "/api/items/;x"}, 400, "", ""},
		{"repeated slashes", baseConfig, req{path: "//api//v1/items?q=1"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		// Dot segments reach an upstream as sent unless the proxy resolves
		// them: an outsider's /files/report.pdf/../../../x ran an Express
		// wildcard route while counted as /x. Refused.
		{"dot segments", baseConfig, req{path: "/api/./v1/x/../items"}, 400, "", ""},
		{"escaped dot segments", baseConfig, req{path: "/api/v1/files/a/%2e%2E/%2E%2e/x"}, 400, "", ""},
		// An escaped slash is a separator to one upstream and a character
		// to another: refused, unless the proxy unescapes such paths first
		// (escaped_slashes: separator). An outsider's /items/7%2F..%2F..%2Fx
		// was /x to the filter and item 7 to Express.
		{"escaped slash", baseConfig, req{path: "/api%2Fv1%2Fitems"}, 400, "", ""},
		{"escaped slash and dot segments", baseConfig, req{path: "/api/v1/items/7%2F..%2F..%2Fx"}, 400, "", ""},
		{"escaped backslash", baseConfig, req{path: "/api/v1/items/7%5c..%5cx"}, 400, "", ""},
		{"backslash", baseConfig, req{path: "/api/v1/items\\x"}, 400, "", ""},
		{"escaped slash in the query", baseConfig, req{path: "/api/v1/items?next=%2Fhome"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"escaped slash, read as a separator", `{"control_cluster":"controlsvc","lease":{"request":0},"escaped_slashes":"separator"}`,
			req{path: "/api%2Fv1%2Fitems"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		// Dot segments between escaped separators are dot segments too (an
		// outsider's separator-mode walk-around of a /files/* rule).
		{"dot segments between escaped slashes, read as separators", `{"control_cluster":"controlsvc","lease":{"request":0},"escaped_slashes":"separator"}`,
			req{path: "/files/report.pdf%2F..%2F..%2Fother"}, 400, "", ""},
		{"login spelled with an escape", baseConfig, req{path: "/api/v1/auth/%6cogin"}, 0, "ip:198.51.100.7", "/api/v1/auth/login"},
		{"malformed escape", baseConfig, req{path: "/api/v1/%zzitems"}, 400, "", ""},
		{"not origin-form", baseConfig, req{path: "api/v1/items"}, 400, "", ""},
		{"lower-case method", baseConfig, req{method: "post", path: "/api/v1/auth/login"}, 400, "", ""},
		{"method with a dash", baseConfig, req{method: "M-SEARCH"}, 400, "", ""},
		{"17-letter method", baseConfig, req{method: "ABCDEFGHIJKLMNOPQ"}, 400, "", ""},
		{"an unusual upper-case method is counted", baseConfig, req{method: "PROPFIND"}, 0, "ip:198.51.100.7", "/api/v1/items"},
		{"excluded path spelled another way is counted", `{"control_cluster":"controlsvc","lease":{"request":0},"excluded_paths":["/health"]}`,
			req{path: "/%68ealth"}, 0, "ip:198.51.100.7", "/health"},
		{"excluded path reached by dot segments is refused", `{"control_cluster":"controlsvc","lease":{"request":0},"excluded_paths":["/health"]}`,
			req{path: "/api/..;/health"}, 400, "", ""},
		// A front controller may route by the query (WordPress's
		// ?rest_route=): an excluded path with one is counted.
		{"excluded path with a query is counted", `{"control_cluster":"controlsvc","lease":{"request":0},"excluded_paths":["/health"]}`,
			req{path: "/health?rest_route=/wp/v2/users"}, 0, "ip:198.51.100.7", "/health"},
		{"10 000 forged headers", baseConfig, req{headers: many}, 0, "ip:198.51.100.7", "/api/v1/items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.config, 1)
			s, act := e.start(tc.r)
			if tc.status != 0 {
				if act != wasmhost.Pause || s.Local == nil || s.Local.Status != tc.status {
					t.Fatalf("action %v, local %+v; want %d", act, s.Local, tc.status)
				}
				if code := mustJSON(t, s.Local.Body)["error"].(map[string]any)["code"]; code != "INVALID_INPUT" {
					t.Fatalf("code %v", code)
				}
				e.noCallout(0)
				return
			}
			_, body := e.callout(0)
			if body.UserID != tc.wantID || body.Endpoint != tc.wantPath {
				t.Fatalf("counted as %q on %q; want %q on %q", body.UserID, body.Endpoint, tc.wantID, tc.wantPath)
			}
			for _, kv := range s.RequestHeaders {
				if headerIsOurs(kv[0]) {
					t.Fatalf("client header %q reached upstream", kv[0])
				}
			}
		})
	}
}

func headerIsOurs(name string) bool {
	return strings.HasPrefix(strings.ReplaceAll(strings.ToLower(name), "_", "-"), "x-tollgate-")
}

// Forged x-tollgate headers go in one host call, however many there are,
// and the underscore spelling goes with them.
func TestForgedHeadersStrippedInOnePass(t *testing.T) {
	e := newEnv(t, baseConfig, 1)
	forged := wasmhost.Headers{{"X_Tollgate_Identity", "user:admin"}, {"x_tollgate_decision", "exempt"}, {"user-agent", "ua"}}
	for i := range 5_000 {
		forged = append(forged, [2]string{"x-tollgate-f" + strconv.Itoa(i), "1"})
	}
	s, _ := e.start(req{headers: forged})
	if n := e.vms[0].HostCalls("proxy_remove_header_map_value"); n != 0 {
		t.Fatalf("%d header removals, want none (one replace of the map)", n)
	}
	if n := e.vms[0].HostCalls("proxy_set_header_map_pairs"); n != 1 {
		t.Fatalf("%d map replacements, want 1", n)
	}
	e.answer(0, "200", decision(true, 5, 0, 0))
	if s.RequestHeaders.Value("user-agent") != "ua" || s.RequestHeaders.Value(":path") != "/api/v1/items" {
		t.Fatalf("legitimate headers lost: %.200v", s.RequestHeaders)
	}
	for _, kv := range s.RequestHeaders {
		if headerIsOurs(kv[0]) && kv[0] != "x-tollgate-identity" && kv[0] != "x-tollgate-tier" && kv[0] != "x-tollgate-decision" {
			t.Fatalf("forged %q reached upstream", kv[0])
		}
	}
	if got := s.RequestHeaders.Values("x-tollgate-identity"); len(got) != 1 || got[0] != "user:alice" {
		t.Fatalf("identity upstream %v", got)
	}
}

// The credential can come from the VM's environment (a Kubernetes Secret
// through Istio's vmConfig.env), never written in the plugin configuration;
// an unset variable or a token given both ways stops the plugin.
func TestDecisionTokenFromTheEnvironment(t *testing.T) {
	e := newEnvWith(t, `{"control_cluster":"controlsvc","decision_token_env":"TOLLGATE_DECISION_TOKEN"}`, 1,
		[]string{"OTHER=x", "TOLLGATE_DECISION_TOKEN=from-the-secret"})
	e.start(req{})
	if c, _ := e.callout(0); c.Headers.Value("authorization") != "Bearer from-the-secret" {
		t.Fatalf("callout headers %v", c.Headers)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		config  string
		environ []string
		want    string
	}{
		{`{"decision_token_env":"TOLLGATE_DECISION_TOKEN"}`, nil, "decision_token_env: TOLLGATE_DECISION_TOKEN is not set"},
		{`{"decision_token_env":"TOLLGATE_DECISION_TOKEN"}`, []string{"TOLLGATE_DECISION_TOKEN="}, "is not set"},
		{`{"decision_token_env":"TOLLGATE_DECISION_TOKEN"}`, []string{"TOLLGATE_DECISION_TOKEN=a b"}, "decision_token_env: must be printable ASCII"},
		{`{"decision_token_env":"T","decision_token":"x"}`, []string{"T=y"}, "decision_token_env: is set beside decision_token"},
		{`{"decision_token_env":"1BAD"}`, nil, "decision_token_env:"},
		{`{"decision_token_env":"A=B"}`, nil, "decision_token_env:"},
	} {
		h, err := wasmhost.New(ctx, wasmBytes, wasmhost.Options{PluginConfig: []byte(tc.config), Clusters: []string{"controlsvc"}, CompilationCache: compCache, WASI: envoyWASI, Env: tc.environ})
		if err != nil {
			t.Fatal(err)
		}
		_, err = h.NewVM(ctx)
		h.Close(ctx)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with %v: got %v; want a refusal containing %q", tc.config, tc.environ, err, tc.want)
		}
	}
}

// The filter sends its service credential, and bounds what it believes of
// an answer: never a larger lease than it asked for, never an identity it
// could not write safely.
func TestCalloutCredentialAndImplausibleAnswers(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","decision_token":"s3cret-token","lease":{"request":3}}`, 1)
	e.start(req{})
	c, _ := e.callout(0)
	if c.Headers.Value("authorization") != "Bearer s3cret-token" {
		t.Fatalf("callout headers %v", c.Headers)
	}
	// A grant of 1000 when 3 were asked for is spent as 3.
	e.answer(0, "200", decision(true, 50, 1000, 0))
	for i := range 3 {
		if _, act := e.start(req{}); act != wasmhost.Continue {
			t.Fatalf("lease hit %d: %v", i, act)
		}
	}
	if _, act := e.start(req{}); act != wasmhost.Pause {
		t.Fatal("more than the 3 asked-for tokens were spent locally")
	}
	// An identity with CRLF is not written upstream: the answer counts as
	// a failed callout (fail_open: degraded, with the filter's own identity).
	bad := strings.Replace(decision(true, 5, 0, 0), `"user:alice"`, `"user:a\r\nx-evil: 1"`, 1)
	c, _ = e.callout(0)
	s := e.vms[0]
	if err := s.Respond(context.Background(), c.Token, wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "200"}}, Body: []byte(bad)}); err != nil {
		t.Fatal(err)
	}
	if !hasLog(s, "implausible answer") {
		t.Fatalf("logs %v", s.Logs())
	}
}

// A crafted request that shares a victim's slot (forced here: one slot)
// cannot evict the victim's live lease by getting itself denied.
func TestDenialCannotEvictAVictimsLease(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":10,"slots":1}}`, 1)
	victim := req{source: "198.51.100.7:1"}
	attacker := req{source: "203.0.113.66:1"}
	e.start(victim)
	e.answer(0, "200", decision(true, 50, 10, 0))
	for i := 0; i < 5; i++ {
		s, _ := e.start(attacker)
		e.answer(0, "429", decision(false, 0, 0, 60))
		if s.Local == nil || s.Local.Status != 429 {
			t.Fatalf("attacker request %d: %+v", i, s.Local)
		}
	}
	hits := e.host.Counter("tollgate_lease_hits_total")
	for i := 0; i < 9; i++ {
		if _, act := e.start(victim); act != wasmhost.Continue {
			t.Fatalf("victim request %d called out: the lease was evicted", i)
		}
	}
	e.noCallout(0)
	if got := e.host.Counter("tollgate_lease_hits_total") - hits; got != 9 {
		t.Fatalf("%d lease hits, want 9", got)
	}
}

// Long identities are cached whole: a 255-byte user id reaches upstream
// intact on a lease hit, and two users differing only in their last byte
// are two callers.
func TestLongIdentitiesOnLeaseHits(t *testing.T) {
	e := newEnv(t, `{"control_cluster":"controlsvc","lease":{"request":5}}`, 1)
	long := "user:" + strings.Repeat("u", 254)
	answer := func(id string) string {
		return strings.Replace(decision(true, 50, 5, 0), `"user:alice"`, strconv.Quote(id), 1)
	}
	e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_a"}}})
	e.answer(0, "200", answer(long+"a"))
	s, act := e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_a"}}})
	if act != wasmhost.Continue || s.RequestHeaders.Value("x-tollgate-identity") != long+"a" {
		t.Fatalf("lease hit identity %d bytes: %.40q", len(s.RequestHeaders.Value("x-tollgate-identity")), s.RequestHeaders.Value("x-tollgate-identity"))
	}
	// Another caller (another key digest) whose identity differs only at the
	// end is not served from the first one's lease.
	if _, act := e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_b"}}}); act != wasmhost.Pause {
		t.Fatal("a second caller was served from the first one's lease")
	}
	e.answer(0, "200", answer(long+"b"))
	s, _ = e.start(req{headers: wasmhost.Headers{{"x-api-key", "tg_b"}}})
	if got := s.RequestHeaders.Value("x-tollgate-identity"); got != long+"b" {
		t.Fatalf("second caller's identity ends %q", got[len(got)-3:])
	}
}

// Method override headers: an upstream that honours them runs the named
// method, so the request is counted under it too (method_override in the
// check); headers that name no method or disagree are refused; with
// method_override "strip" they never reach the upstream.
func TestMethodOverrideHeaders(t *testing.T) {
	strip := `{"control_cluster":"controlsvc","lease":{"request":0},"method_override":"strip"}`
	for _, tc := range []struct {
		name     string
		config   string
		r        req
		status   int    // a local answer, or 0 for a callout
		override string // the callout's method_override
	}{
		{"override counted", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", "DELETE"}}}, 0, "DELETE"},
		{"lower-case override, as frameworks read it", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-method-override", "delete"}}}, 0, "DELETE"},
		{"X-HTTP-Method", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method", "PUT"}}}, 0, "PUT"},
		{"underscore spelling", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x_http_method_override", "PATCH"}}}, 0, "PATCH"},
		{"the request's own method", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", "POST"}}}, 0, ""},
		{"two agreeing headers", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", "GET"}, {"x-method-override", "get"}}}, 0, "GET"},
		{"two disagreeing headers", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", "GET"}, {"x-method-override", "DELETE"}}}, 400, ""},
		{"no method", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", "GET /admin"}}}, 400, ""},
		{"empty", baseConfig, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", ""}}}, 400, ""},
		{"stripped", strip, req{method: "POST", headers: wasmhost.Headers{{"x-http-method-override", "DELETE"}, {"x_method_override", "GET"}}}, 0, ""},
		// The same in the query string (Laravel, Symfony, Express's
		// method-override route ?_method=DELETE as a DELETE).
		{"_method parameter counted", baseConfig, req{method: "POST", path: "/api/v1/items?_method=DELETE"}, 0, "DELETE"},
		{"_method parameter percent-encoded, lower case", baseConfig, req{method: "POST", path: "/api/v1/items?a=1&%5Fmethod=delete"}, 0, "DELETE"},
		{"_method parameter agreeing with the header", baseConfig, req{method: "POST", path: "/api/v1/items?_method=PUT", headers: wasmhost.Headers{{"x-http-method-override", "put"}}}, 0, "PUT"},
		{"_method parameter disagreeing with the header", baseConfig, req{method: "POST", path: "/api/v1/items?_method=PUT", headers: wasmhost.Headers{{"x-http-method-override", "DELETE"}}}, 400, ""},
		{"two _method parameters disagreeing", baseConfig, req{method: "POST", path: "/api/v1/items?_method=PUT;_method=DELETE"}, 400, ""},
		{"_method parameter naming no method", baseConfig, req{method: "POST", path: "/api/v1/items?_method=%3Cscript%3E"}, 400, ""},
		{"_method parameter stripped", strip, req{method: "POST", path: "/api/v1/items?a=1&_method=DELETE;b=2"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.config, 1)
			s, act := e.start(tc.r)
			if tc.status != 0 {
				if act != wasmhost.Pause || s.Local == nil || s.Local.Status != tc.status {
					t.Fatalf("action %v, local %+v; want %d", act, s.Local, tc.status)
				}
				e.noCallout(0)
				return
			}
			_, body := e.callout(0)
			if body.MethodOverride != tc.override || body.Method != tc.r.method {
				t.Fatalf("counted as %q overridden to %q; want %q overridden to %q", body.Method, body.MethodOverride, tc.r.method, tc.override)
			}
			if tc.config == strip {
				if p := s.RequestHeaders.Value(":path"); strings.Contains(strings.ToLower(p), "method") {
					t.Fatalf(":path %q still carries the override", p)
				}
				for _, kv := range s.RequestHeaders {
					if strings.HasPrefix(strings.ReplaceAll(kv[0], "_", "-"), "x-") && strings.Contains(kv[0], "method") {
						t.Fatalf("header %q reached the upstream", kv[0])
					}
				}
			}
		})
	}
}
