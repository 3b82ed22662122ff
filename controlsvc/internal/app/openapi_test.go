package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// Every route answers as /openapi.yaml says: real requests to each route
// (and to its errors), each answer validated against the document, and
// every operation of the document exercised.
func TestAnswersMatchTheOpenAPIDocument(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "[[rules]]\nid = \"login\"\npath = \"/login\"\nscope = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow_seconds = 60\n"+
		"[[rules]]\nid = \"llm\"\npath = \"/llm\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\nlimit = 1000\nwindow_seconds = 60\ncost_from = \"response_json:usage.total_tokens\"\nreserve = 200\n", nil)
	spec := s.do("GET", "/openapi.yaml", nil)
	if spec.status != 200 || spec.header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("/openapi.yaml: %d %s", spec.status, spec.header.Get("Content-Type"))
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(spec.body)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	ctx := context.Background()
	if err := doc.Validate(ctx); err != nil {
		t.Fatalf("the document is not valid OpenAPI: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: s.base}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	call := func(method, path string, body any, admin bool) map[string]any {
		t.Helper()
		var r *response
		if admin {
			r = s.admin(method, path, body)
		} else {
			r = s.do(method, path, body)
		}
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, s.base+path, rd)
		route, params, err := router.FindRoute(req)
		if err != nil {
			t.Fatalf("%s %s: no route in the document: %v", method, path, err)
		}
		seen[route.Method+" "+route.Path] = true
		in := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
			Status:                 r.status, Header: r.header, Body: io.NopCloser(bytes.NewReader(r.body)),
		}
		if err := openapi3filter.ValidateResponse(ctx, in); err != nil {
			t.Errorf("%s %s -> %d does not match the document: %v\n%s", method, path, r.status, err, r.body)
		}
		var m map[string]any
		_ = json.Unmarshal(r.body, &m)
		return m
	}
	check := map[string]any{"user_id": "ip:192.0.2.1", "endpoint": "/login"}
	call("POST", "/v1/rate-limit/check", check, false)
	call("POST", "/v1/rate-limit/check", check, false) // 429
	call("POST", "/v1/rate-limit/check", map[string]any{"user_id": "", "endpoint": "/x"}, false)
	call("POST", "/v1/rate-limit/batch-check", map[string]any{"idempotency_key": "k1", "checks": []any{check, map[string]any{"user_id": "a"}}}, false)
	// A cost charged after the response: the check lists the rule, the
	// charge answers where it stands; a bad charge is refused.
	if admitted := call("POST", "/v1/rate-limit/check", map[string]any{"user_id": "dave", "endpoint": "/llm"}, false); admitted["charges"] == nil {
		t.Errorf("an admission under a response cost lists no charges: %v", admitted)
	}
	call("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "dave", "endpoint": "/llm", "charges": []any{map[string]any{"rule_id": "llm", "cost": 250}}}, false)
	call("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "dave", "endpoint": "/llm", "charges": []any{map[string]any{"rule_id": "llm", "cost": 50, "reserved": 199, "reserved_at": 1795676400000001}}}, false)
	call("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "dave", "endpoint": "/llm", "charges": []any{map[string]any{"rule_id": "llm", "unreported": "cut"}, map[string]any{"rule_id": "login", "cost": 1}}}, false)
	call("POST", "/v1/rate-limit/charge", map[string]any{"user_id": "dave", "endpoint": "/llm", "charges": []any{map[string]any{"rule_id": "llm", "cost": -1}}}, false)
	call("GET", "/v1/rate-limit/status/alice/items?method=GET", nil, false)
	call("GET", "/v1/rate-limit/status/alice/items?colour=red", nil, false)
	call("POST", "/v1/rate-limit/reset", map[string]any{"user_id": "alice", "endpoint": "/items"}, true)
	call("PUT", "/v1/rate-limit/config", map[string]any{"user_id": "alice", "endpoint": "/items", "limit": 5, "window_seconds": 60, "strategy": "gcra"}, true)
	call("GET", "/admin/v1/overrides", nil, true)
	call("DELETE", "/v1/rate-limit/config", map[string]any{"user_id": "alice", "endpoint": "/items"}, true)
	call("DELETE", "/v1/rate-limit/config", map[string]any{"user_id": "alice", "endpoint": "/items"}, true) // 404
	key := call("POST", "/admin/v1/api-keys", map[string]any{"user_id": 42, "tier_id": 2}, true)
	call("POST", "/admin/v1/api-keys", map[string]any{"user_id": 42, "tier_id": 9}, true)
	call("GET", "/admin/v1/api-keys?limit=1", nil, true)
	call("GET", "/admin/v1/api-keys/"+fmt.Sprint(key["key_id"]), nil, true)
	call("GET", "/admin/v1/api-keys/k_nope", nil, true)
	call("POST", "/admin/v1/api-keys/"+url.PathEscape(fmt.Sprint(key["api_key"]))+"/revoke", nil, true)
	call("GET", "/admin/v1/rules", nil, true)
	rule := call("POST", "/admin/v1/rate-limit-rules", map[string]any{"tier_id": 1, "endpoint_pattern": "/up", "limit": 5, "window_seconds": 60}, true)
	id := fmt.Sprint(rule["rule_id"])
	call("POST", "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "up", "limit": 5, "window_seconds": 60}, true)
	call("GET", "/admin/v1/rate-limit-rules?tier_id=1", nil, true)
	call("GET", "/admin/v1/rate-limit-rules/"+id, nil, true)
	call("GET", "/admin/v1/rate-limit-rules/login", nil, true)
	call("PUT", "/admin/v1/rate-limit-rules/"+id, map[string]any{"limit": 6}, true)
	// A rule's own response: set, shown, sent with a denial, refused when
	// bad, removed with null.
	custom := map[string]any{"endpoint_pattern": "/custom", "limit": 1, "window_seconds": 60,
		"response": map[string]any{"status": 403, "body": `{"retry":{{retry_after}}}`, "headers": map[string]string{"x-why": "quota"}}}
	withResponse := call("POST", "/admin/v1/rate-limit-rules", custom, true)
	customID := fmt.Sprint(withResponse["rule_id"])
	call("POST", "/v1/rate-limit/check", map[string]any{"user_id": "carol", "endpoint": "/custom"}, false)
	if denied := call("POST", "/v1/rate-limit/check", map[string]any{"user_id": "carol", "endpoint": "/custom"}, false); denied["refusal"] == nil {
		t.Errorf("a denial by a rule with a response carries no refusal: %v", denied)
	}
	call("PUT", "/admin/v1/rate-limit-rules/"+customID, map[string]any{"response": map[string]any{"status": 200}}, true)
	call("PUT", "/admin/v1/rate-limit-rules/"+customID, map[string]any{"response": nil}, true)
	call("PUT", "/admin/v1/rate-limit-rules/login", map[string]any{"limit": 6}, true)
	call("DELETE", "/admin/v1/rate-limit-rules/"+id, nil, true)
	call("DELETE", "/admin/v1/rate-limit-rules/"+id, nil, true)
	call("GET", "/admin/v1/tiers", nil, true)
	call("PUT", "/admin/v1/tiers/3", map[string]any{"name": "gold", "limit": 5, "window_seconds": 60}, true)
	call("PUT", "/admin/v1/tiers/1", map[string]any{"name": "free", "limit": 5, "window_seconds": 60}, true)
	if err := s.app.FlushUsage(ctx); err != nil {
		t.Fatal(err)
	}
	call("GET", "/admin/v1/usage/"+fmt.Sprint(key["key_id"])+"?window=current", nil, true)
	call("GET", "/admin/v1/usage/ip:192.0.2.1", nil, true)
	call("GET", "/admin/v1/audit?limit=5", nil, true)
	call("GET", "/admin/v1/metrics/summary?window=1h", nil, true)
	call("GET", "/admin/v1/status/"+url.PathEscape(fmt.Sprint("key:", key["key_id"]))+"/items", nil, true)
	call("GET", "/admin/v1/metrics/summary?window=7d", nil, true)
	call("GET", "/admin/v1/audit?type=nope", nil, true)
	call("GET", "/admin/v1/rules", nil, false) // 401
	call("GET", "/health", nil, false)
	call("GET", "/metrics", nil, false)
	call("GET", "/openapi.yaml", nil, false)
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !seen[method+" "+path] {
				t.Errorf("%s %s is in the document but no test request reached it", method, path)
			}
		}
	}
	if !strings.Contains(string(spec.body), "openapi: 3.1") {
		t.Fatal("not an OpenAPI 3.1 document")
	}
}
