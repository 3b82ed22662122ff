package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/shared/wire"
	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// countersExcept serialises every rate-limit key outside an identity's hash
// tag: two equal snapshots mean no other caller's counters moved.
func (s *service) countersExcept(identity string) string {
	s.t.Helper()
	ctx := context.Background()
	var lines []string
	for _, k := range s.rdb.Keys(ctx, "rl:{*").Val() {
		if identity != "" && strings.Contains(k, identity) {
			continue
		}
		v, err := s.rdb.Dump(ctx, k).Result()
		if err != nil {
			s.t.Fatal(err)
		}
		lines = append(lines, k+"="+strconv.Quote(v))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// An attacker who reaches the decision API directly, or a client the filter
// forwards, tries every class of hostile request against two services on one
// Redis: "filter", which requires the decision token (the shipped setup), and
// "open", on loopback without a token (plain seed shape only). Each row
// asserts the status, the code (and the field named), and that no counter of
// any other identity moved: the victim's keys, dumped before and after.
// rawKeyLike has the shape of an issued API key.
const rawKeyLike = "ak_live_0123456789abcdefghijABCDEFGHIJ_-01234567890"

func TestDecisionAPIHostile(t *testing.T) {
	filter := startService(t, "", nil)
	open := startServiceOn(t, filter.redis, "redis://"+filter.redis.Addr+"/0", "", map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	const attacker = "user:mallory"
	const items = `"endpoint":"/api/v1/items"`
	if r := filter.check(`{"user_id":"user:victim",` + items + `,"lease":5}`); r.status != 200 {
		t.Fatalf("victim: %d %s", r.status, r.body)
	}
	// The victim's API key: its identity must not be reachable without it.
	if r := filter.check(`{"user_id":"key:k_victim",` + items + `}`); r.status != 200 {
		t.Fatalf("victim key: %d %s", r.status, r.body)
	}
	// The attacker's own counter for the path, spent: every other spelling
	// of the path must land on it and be denied.
	// A token bucket refilling 1 an hour: no window edge for the table's
	// requests to straddle (a fixed window could open anew mid-test).
	adhoc := `,"strategy":"token_bucket","limit":1,"window_seconds":3600`
	if r := filter.check(`{"user_id":"user:mallory",` + items + adhoc + `}`); r.status != 200 {
		t.Fatalf("attacker: %d %s", r.status, r.body)
	}
	// The attacker's own batch claims an idempotency key first.
	batch := func(key string, ids ...string) string {
		var checks []string
		for _, id := range ids {
			checks = append(checks, fmt.Sprintf(`{"user_id":%q,`+items+`}`, id))
		}
		return fmt.Sprintf(`{"idempotency_key":%q,"checks":[%s]}`, key, strings.Join(checks, ","))
	}
	if r := filter.do(http.MethodPost, "/v1/rate-limit/batch-check", batch("k-1", attacker)); r.status != 200 {
		t.Fatalf("first batch: %d %s", r.status, r.body)
	}
	noAuth := []string{"Authorization", ""}
	asAdmin := []string{"Authorization", "Bearer " + adminToken}
	const rulesPath = "/admin/v1/rate-limit-rules"
	const check, batchPath = "/v1/rate-limit/check", "/v1/rate-limit/batch-check"
	mallory := func(extra string) string { return `{"user_id":"user:mallory",` + items + extra + `}` }
	victim := func(extra string) string { return `{"user_id":"user:victim",` + items + extra + `}` }
	for _, tc := range []struct {
		name   string
		svc    *service
		method string
		path   string
		body   string
		header []string
		status int
		code   string
		field  string
	}{
		// The service credential.
		{"no credential", filter, "POST", check, victim(""), noAuth, 401, "UNAUTHORIZED", ""},
		{"wrong credential", filter, "POST", check, victim(""), []string{"Authorization", "Bearer " + strings.Repeat("x", 40)}, 401, "UNAUTHORIZED", ""},
		{"credential as a prefix", filter, "POST", check, victim(""), []string{"Authorization", "Bearer " + decisionToken[:20]}, 401, "UNAUTHORIZED", ""},
		{"credential not as a bearer", filter, "POST", check, victim(""), []string{"Authorization", "Basic " + decisionToken}, 401, "UNAUTHORIZED", ""},
		{"credential header repeated", filter, "POST", check, victim(""), []string{"Authorization", "Bearer " + decisionToken, "Authorization", "Basic " + decisionToken}, 401, "UNAUTHORIZED", ""},
		{"admin credential repeated", filter, "POST", "/v1/rate-limit/reset", `{"user_id":"user:victim",` + items + `}`, []string{"X-Admin-Token", adminToken, "X-Admin-Token", "x"}, 401, "UNAUTHORIZED", ""},
		{"admin credential in both headers", filter, "POST", "/v1/rate-limit/reset", `{"user_id":"user:victim",` + items + `}`, []string{"X-Admin-Token", adminToken, "Authorization", "Bearer x"}, 401, "UNAUTHORIZED", ""},
		{"admin credential in both headers, the other way", filter, "POST", "/v1/rate-limit/reset", `{"user_id":"user:victim",` + items + `}`, []string{"X-Admin-Token", "x", "Authorization", "Bearer " + adminToken}, 401, "UNAUTHORIZED", ""},
		{"admin token is not the decision token", filter, "POST", check, victim(""), []string{"Authorization", "Bearer " + adminToken}, 401, "UNAUTHORIZED", ""},
		{"status without credential", filter, "GET", "/v1/rate-limit/status/user:victim/api/v1/items", "", noAuth, 401, "UNAUTHORIZED", ""},
		{"batch without credential", filter, "POST", batchPath, batch("", "user:victim"), noAuth, 401, "UNAUTHORIZED", ""},
		{"decision token on an admin route", filter, "POST", "/v1/rate-limit/reset", `{"user_id":"user:victim",` + items + `}`, nil, 401, "UNAUTHORIZED", ""},
		// What only a trusted filter may say.
		{"caller-chosen tier", open, "POST", check, mallory(`,"tier":"premium"`), nil, 403, "FORBIDDEN", "tier"},
		{"caller-chosen tier, field name in capitals", open, "POST", check, mallory(`,"TIER":"premium"`), nil, 400, "INVALID_INPUT", "TIER"},
		{"user_id twice (a proxy may read the first)", filter, "POST", check, `{"user_id":"user:victim","user_id":"user:mallory","endpoint":"/z"}`, nil, 400, "INVALID_INPUT", "user_id"},
		{"user_id in another case beside it", filter, "POST", check, `{"user_id":"user:victim","User_Id":"user:mallory","endpoint":"/z"}`, nil, 400, "INVALID_INPUT", "User_Id"},
		// Text that is not UTF-8 is refused, not read as U+FFFD: several
		// such ids (or paths) would spend one counter.
		{"user_id with a byte that is not UTF-8", filter, "POST", check, "{\"user_id\":\"user:\xff\"," + items + "}", nil, 400, "INVALID_INPUT", "user_id"},
		{"user_id with half a surrogate pair", filter, "POST", check, `{"user_id":"user:\ud800",` + items + `}`, nil, 400, "INVALID_INPUT", "user_id"},
		{"endpoint with a byte that is not UTF-8", filter, "POST", check, "{\"user_id\":\"user:mallory\",\"endpoint\":\"/\xc3(\"}", nil, 400, "INVALID_INPUT", "endpoint"},
		{"batch check with half a surrogate pair", filter, "POST", batchPath, `{"checks":[{"user_id":"user:mallory",` + items + `},{"user_id":"user:\udfff",` + items + `}]}`, nil, 400, "INVALID_INPUT", "checks[1].user_id"},
		{"caller-chosen tenant", open, "POST", check, mallory(`,"tenant":"acme"`), nil, 403, "FORBIDDEN", "tenant"},
		{"caller-chosen cost", open, "POST", check, mallory(`,"cost":2`), nil, 403, "FORBIDDEN", "cost"},
		{"key identity without the key", open, "POST", check, `{"user_id":"key:k_victim",` + items + `}`, nil, 403, "FORBIDDEN", "user_id"},
		{"lease without credential", open, "POST", check, victim(`,"lease":100`), nil, 403, "FORBIDDEN", "lease"},
		{"refund to a shared bucket without credential", open, "POST", check, victim(`,"returned":100`), nil, 403, "FORBIDDEN", "returned"},
		{"tier in a status query", open, "GET", "/v1/rate-limit/status/user:victim/api/v1/items?tier=premium", "", nil, 403, "FORBIDDEN", "tier"},
		{"made-up api key", open, "POST", check, mallory(`,"api_key":"tg_nope"`), nil, 400, "INVALID_API_KEY", ""},
		// Bounded work.
		{"cost above the limit", filter, "POST", check, mallory(`,"cost":101`), nil, 400, "INVALID_INPUT", "cost"},
		{"cost above an ad-hoc limit", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/y","limit":10,"cost":11}`, nil, 400, "INVALID_INPUT", "cost"},
		{"huge ad-hoc limit", filter, "POST", check, mallory(`,"strategy":"sliding_log","limit":9223372036854775807,"cost":1000000`), nil, 400, "INVALID_LIMIT", "limit"},
		{"ad-hoc limit above max_adhoc_limit", open, "POST", check, mallory(`,"strategy":"sliding_log","limit":1000001`), nil, 400, "INVALID_LIMIT", "limit"},
		{"ad-hoc window beyond an hour", open, "POST", check, mallory(`,"limit":5,"window_seconds":3601`), nil, 400, "INVALID_LIMIT", "window_seconds"},
		{"cost beyond an int64", filter, "POST", check, mallory(`,"cost":1e30`), nil, 400, "INVALID_INPUT", "cost"},
		// Idempotency.
		{"idempotency key reused for the victim", filter, "POST", batchPath, batch("k-1", "user:victim"), nil, 409, "IDEMPOTENCY_KEY_REUSED", "idempotency_key"},
		// One resource, one counter, however it is spelled.
		{"escaped letter", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/%69tems"` + adhoc + `}`, nil, 429, "RATE_LIMIT_EXCEEDED", ""},
		{"double slash", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1//items"` + adhoc + `}`, nil, 429, "RATE_LIMIT_EXCEEDED", ""},
		{"parameter", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/items;a"` + adhoc + `}`, nil, 429, "RATE_LIMIT_EXCEEDED", ""},
		{"dot segment", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/./items"` + adhoc + `}`, nil, 429, "RATE_LIMIT_EXCEEDED", ""},
		{"dot-dot segment", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/x/../items"` + adhoc + `}`, nil, 429, "RATE_LIMIT_EXCEEDED", ""},
		{"trailing slash and query", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/items/?a=1"` + adhoc + `}`, nil, 429, "RATE_LIMIT_EXCEEDED", ""},
		{"malformed escape in endpoint", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/%zz"}`, nil, 400, "INVALID_INPUT", "endpoint"},
		{"escaped NUL in endpoint", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/items%00"}`, nil, 400, "INVALID_INPUT", "endpoint"},
		// Identities and endpoints that try to break out of their key.
		{"crlf identity", filter, "POST", check, `{"user_id":"user:victim\r\nx: 1",` + items + `}`, nil, 400, "INVALID_INPUT", "user_id"},
		{"brace identity", filter, "POST", check, `{"user_id":"user:mallory}{identity:user:victim",` + items + `}`, nil, 200, "", ""},
		{"10 kB identity", filter, "POST", check, `{"user_id":"user:` + strings.Repeat("a", 10_000) + `",` + items + `}`, nil, 400, "INVALID_INPUT", "user_id"},
		{"crlf endpoint", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/api/v1/items\r\nHost: x"}`, nil, 400, "INVALID_INPUT", "endpoint"},
		{"10 kB endpoint", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/` + strings.Repeat("a", 10_000) + `"}`, nil, 400, "INVALID_INPUT", "endpoint"},
		// Bodies.
		{"malformed json", filter, "POST", check, `{"user_id":`, nil, 400, "INVALID_INPUT", "body"},
		{"two json values", filter, "POST", check, mallory("") + victim(""), nil, 400, "INVALID_INPUT", "body"},
		{"unknown field on the decision API is refused", filter, "POST", check, `{"user_id":"user:mallory","endpoint":"/z","identity":"user:victim"}`, nil, 400, "INVALID_INPUT", "identity"},
		{"unknown field on an admin route is refused", filter, "POST", "/v1/rate-limit/reset", `{"user_id":"user:victim",` + items + `,"everyone":true}`, []string{"Authorization", "Bearer " + adminToken}, 400, "INVALID_INPUT", "everyone"},
		{"oversize body", filter, "POST", check, mallory(`,"pad":"` + strings.Repeat("a", 1<<20) + `"`), nil, 413, "PAYLOAD_TOO_LARGE", ""},
		// The operator's surface: hostile input from a valid admin token.
		{"rule pattern with crlf", filter, "POST", rulesPath, `{"endpoint_pattern":"/a\r\nx: y","limit":1,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "endpoint_pattern"},
		{"10 kB rule pattern", filter, "POST", rulesPath, `{"endpoint_pattern":"/` + strings.Repeat("*", 10_000) + `","limit":1,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "endpoint_pattern"},
		{"rule named exempt by path id", filter, "PUT", rulesPath + "/exempt", `{"limit":1}`, asAdmin, 404, "NOT_FOUND", ""},
		{"rule limit of the wrong type", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":"1","window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "limit"},
		{"nested unknown field in a tier", filter, "PUT", "/admin/v1/tiers/9", `{"name":"t","limit":1,"window_seconds":60,"endpoints":{"/a":1},"extra":{"x":1}}`, asAdmin, 400, "INVALID_INPUT", "extra"},
		{"rule limit a double would round", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":9007199254740992,"window_seconds":60}`, asAdmin, 400, "INVALID_LIMIT", "limit"},
		{"rule priority beyond bounds", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"priority":9223372036854775807}`, asAdmin, 400, "INVALID_INPUT", "priority"},
		{"rule method listed twice", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"methods":["GET","GET"]}`, asAdmin, 400, "INVALID_INPUT", "methods[1]"},
		{"rule limit given twice", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"limit":100000}`, asAdmin, 400, "INVALID_INPUT", "limit"},
		{"rule response with status 200", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"status":200}}`, asAdmin, 400, "INVALID_INPUT", "response.status"},
		{"rule response header with crlf", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"headers":{"x-a":"b\r\nset-cookie: s=1"}}}`, asAdmin, 400, "INVALID_INPUT", `response.headers["x-a"]`},
		{"rule response setting content-length", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"headers":{"content-length":"0"}}}`, asAdmin, 400, "INVALID_INPUT", `response.headers["content-length"]`},
		{"rule response body naming the identity", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"body":"{{identity}}"}}`, asAdmin, 400, "INVALID_INPUT", "response.body"},
		{"rule response with an unknown field", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"code":403}}`, asAdmin, 400, "INVALID_INPUT", "response.code"},
		{"rule response 5 kB body", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"body":"` + strings.Repeat("b", 5000) + `"}}`, asAdmin, 400, "INVALID_INPUT", "response.body"},
		{"rule period of a week", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"period":"week"}`, asAdmin, 400, "INVALID_INPUT", "period"},
		{"rule in an unknown time zone", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"period":"day","time_zone":"Mars/Olympus_Mons"}`, asAdmin, 400, "INVALID_INPUT", "time_zone"},
		{"rule period with a sliding window", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"period":"month","algorithm":"sliding_window"}`, asAdmin, 400, "INVALID_STRATEGY", "algorithm"},
		{"rule cost from an unknown source", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"cost_from":"cookie:x"}`, asAdmin, 400, "INVALID_INPUT", "cost_from"},
		{"rule reserve without a response cost", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":10,"window_seconds":60,"reserve":5}`, asAdmin, 400, "INVALID_INPUT", "reserve"},
		{"rule reserve past its capacity", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":10,"window_seconds":60,"cost_from":"response_json:usage.total_tokens","reserve":11}`, asAdmin, 400, "INVALID_INPUT", "reserve"},
		{"rule reserve of a fraction", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":10,"window_seconds":60,"cost_from":"response_json:usage.total_tokens","reserve":2.5}`, asAdmin, 400, "INVALID_INPUT", "reserve"},
		{"check with a cost header that is no number", filter, "POST", check, mallory(`,"cost_headers":{"x-tokens":"1e9"}`), nil, 200, "", ""},
		{"check with a negative body size", filter, "POST", check, mallory(`,"body_bytes":-1`), nil, 400, "INVALID_INPUT", "body_bytes"},
		{"check with nine cost headers", filter, "POST", check, mallory(`,"cost_headers":{"a":"1","b":"1","c":"1","d":"1","e":"1","f":"1","g":"1","h":"1","i":"1"}`), nil, 400, "INVALID_INPUT", "cost_headers"},
		{"rule response with a key in capitals", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"status":200,"Status":503}}`, asAdmin, 400, "INVALID_INPUT", "response.Status"},
		{"rule response with a key twice", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","limit":1,"window_seconds":60,"response":{"status":429,"status":503}}`, asAdmin, 400, "INVALID_INPUT", "response.status"},
		{"rule limit spelled in capitals", filter, "POST", rulesPath, `{"endpoint_pattern":"/a","LIMIT":100000,"limit":1,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "LIMIT"},
		{"tier description with crlf", filter, "PUT", "/admin/v1/tiers/9", `{"name":"t","limit":1,"window_seconds":60,"description":"a\r\nX-Injected: 1"}`, asAdmin, 400, "INVALID_INPUT", "description"},
		{"10 kB tier description", filter, "PUT", "/admin/v1/tiers/9", `{"name":"t","limit":1,"window_seconds":60,"description":"` + strings.Repeat("d", 10_000) + `"}`, asAdmin, 400, "INVALID_INPUT", "description"},
		{"tier name with braces", filter, "PUT", "/admin/v1/tiers/9", `{"name":"a}{b","limit":1,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "name"},
		{"tier id beyond bounds", filter, "PUT", "/admin/v1/tiers/99999999999", `{"name":"t","limit":1,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "tier_id"},
		{"api key for a crlf user", filter, "POST", "/admin/v1/api-keys", `{"user_id":"a\r\nb"}`, asAdmin, 400, "INVALID_INPUT", "user_id"},
		{"api key expiry that is only a date", filter, "POST", "/admin/v1/api-keys", `{"user_id":"u","expires_at":"2030-01-01"}`, asAdmin, 400, "INVALID_INPUT", "expires_at"},
		{"api key user id beyond an int64", filter, "POST", "/admin/v1/api-keys", `{"user_id":99999999999999999999}`, asAdmin, 400, "INVALID_INPUT", "user_id"},
		{"usage of a crlf identity", filter, "GET", "/admin/v1/usage/user:a%0D%0Ab", "", asAdmin, 400, "INVALID_INPUT", "identity"},
		{"audit since that is not an id", filter, "GET", "/admin/v1/audit?since=1-x%0D%0AFLUSHALL", "", asAdmin, 400, "INVALID_INPUT", "since"},
		{"key listing page too large", filter, "GET", "/admin/v1/api-keys?limit=100000", "", asAdmin, 400, "INVALID_INPUT", "limit"},
		{"key listing user_id twice", filter, "GET", "/admin/v1/api-keys?user_id=42&user_id=43", "", asAdmin, 400, "INVALID_INPUT", "user_id"},
		{"audit type twice", filter, "GET", "/admin/v1/audit?type=admin&type=violation", "", asAdmin, 400, "INVALID_INPUT", "type"},
		{"rule listing with an unknown parameter", filter, "GET", "/admin/v1/rate-limit-rules?tier=free", "", asAdmin, 400, "INVALID_INPUT", "tier"},
		{"audit query with a ';' (dropped the whole query)", filter, "GET", "/admin/v1/audit?type=violation;x=1", "", asAdmin, 400, "INVALID_INPUT", "query"},
		{"tier listing with a parameter", filter, "GET", "/admin/v1/tiers?all=1", "", asAdmin, 400, "INVALID_INPUT", "all"},
		{"tier id with a leading zero", filter, "PUT", "/admin/v1/tiers/03", `{"name":"z","limit":1,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "tier_id"},
		{"raw api key as an override's user", filter, "PUT", "/v1/rate-limit/config", `{"user_id":"` + rawKeyLike + `","endpoint":"/a","limit":5,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "user_id"},
		{"override for a pattern", filter, "PUT", "/v1/rate-limit/config", `{"user_id":"user:mallory","endpoint":"/api/*","limit":5000,"window_seconds":60}`, asAdmin, 400, "INVALID_INPUT", "endpoint"},
		{"raw api key as a reset's user", filter, "POST", "/v1/rate-limit/reset", `{"user_id":"user:` + rawKeyLike + `",` + items + `}`, asAdmin, 400, "INVALID_INPUT", "user_id"},
		{"raw legacy api key as a check's user", filter, "POST", check, `{"user_id":"tg_` + rawKeyLike[len("ak_live_"):] + `",` + items + `}`, nil, 400, "INVALID_INPUT", "user_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := filter.countersExcept(attacker)
			var body any
			if tc.body != "" {
				body = tc.body
			}
			r := tc.svc.do(tc.method, tc.path, body, tc.header...)
			if r.status != tc.status || (tc.code != "" && r.errorCode(t) != tc.code) {
				t.Fatalf("%d %s; want %d %s", r.status, truncate(r.body), tc.status, tc.code)
			}
			if tc.field != "" {
				if f := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"]; f != tc.field {
					t.Fatalf("details.field %v, want %s: %s", f, tc.field, r.body)
				}
			}
			if tc.status == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 with WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
			}
			if after := filter.countersExcept(attacker); after != before {
				t.Fatalf("other callers' counters moved:\n%s\n---\n%s", before, after)
			}
		})
	}
	// Rows above sent right, wrong, partial and repeated credentials, and
	// raw API keys; none of them may reach a log line.
	for _, s := range []*service{filter, open} {
		for _, secret := range []string{decisionToken, decisionToken[:20], adminToken, rawKeyLike[len("ak_live_"):]} {
			if strings.Contains(s.logs.String(), secret) {
				t.Fatalf("a credential reached the log:\n%s", s.logs.String())
			}
		}
	}
}

// Without a decision token (a service on loopback only), callers get the
// seed's plain check and nothing a filter alone may say.
func TestUntrustedCallerPlainShapeOnly(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "", map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	plain := func(extra string) string {
		return `{"user_id":"alice","endpoint":"/api/v1/items","method":"GET"` + extra + `}`
	}
	for _, tc := range []struct {
		body   string
		status int
		field  string
	}{
		{plain(``), 200, ""},
		{plain(`,"strategy":"fixed_window","limit":10,"window_seconds":60`), 200, ""},
		{plain(`,"tier":"premium"`), 403, "tier"},
		{plain(`,"tenant":"acme"`), 403, "tenant"},
		{plain(`,"cost":50`), 403, "cost"},
		{plain(`,"lease":10`), 403, "lease"},
		{plain(`,"returned":10`), 403, "returned"},
		{plain(`,"charge_returned":10`), 403, "charge_returned"},
		{plain(`,"leased_at":1795676400000`), 403, "leased_at"},
		{plain(`,"charge_leased_at":1795676400000`), 403, "charge_leased_at"},
		{`{"user_id":"key:k_victim","endpoint":"/api/v1/items"}`, 403, "user_id"},
	} {
		before := s.countersExcept("\x00") // every counter, alice's too
		r := s.do(http.MethodPost, "/v1/rate-limit/check", tc.body, "Authorization", "")
		if r.status != tc.status {
			t.Fatalf("%s: %d %s", tc.body, r.status, r.body)
		}
		if tc.status == 403 {
			if r.errorCode(t) != "FORBIDDEN" || r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"] != tc.field {
				t.Fatalf("%s: %s", tc.body, r.body)
			}
			if after := s.countersExcept("\x00"); after != before {
				t.Fatalf("%s: a refused request moved counters:\n%s\n---\n%s", tc.body, before, after)
			}
		}
	}
}

// Without a decision token, the decision API answers no web page: a
// request with an Origin (a page on any origin can send a simple POST and
// spend any caller's quota) or a Host that is no loopback name (a page
// rebound to loopback by DNS) is refused, counting nothing (an outsider's
// page spent user:alice's quota with fetch in no-cors mode).
func TestUntrustedRefusesBrowsers(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "", map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	body := `{"user_id":"alice","endpoint":"/api/v1/items","method":"GET"}`
	for _, tc := range []struct {
		name, origin, host string
		status             int
	}{
		{"a local tool", "", "", 200},
		{"localhost", "", "localhost", 200},
		{"a page on another origin", "https://evil.example", "", 403},
		{"a null origin", "null", "", 403},
		{"a rebound name", "", "evil.example:8081", 403},
		{"a LAN address", "", "192.168.1.10", 403},
	} {
		before := s.countersExcept("\x00")
		req, err := http.NewRequest(http.MethodPost, s.base+"/v1/rate-limit/check", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		if tc.host != "" {
			req.Host = tc.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
		if after := s.countersExcept("\x00"); tc.status == 403 && after != before {
			t.Errorf("%s: a refused request moved counters", tc.name)
		}
	}
}

// Two tokens are accepted while rotating; any other is not.
func TestDecisionTokenRotation(t *testing.T) {
	next := "next-decision-token-abcdefghijklmnopqrstuvwxyz"
	s := startService(t, "", map[string]string{"TOLLGATE_DECISION_TOKEN": decisionToken + "," + next})
	for tok, want := range map[string]int{decisionToken: 200, next: 200, next + "x": 401, "": 401} {
		r := s.do(http.MethodPost, "/v1/rate-limit/check", `{"user_id":"u","endpoint":"/x"}`, "Authorization", "Bearer "+tok)
		if r.status != want {
			t.Errorf("token %.8q...: %d, want %d", tok, r.status, want)
		}
	}
}

// Refunds credit a bucket only with tokens a filter was leased from it: a
// caller without the credential cannot return tokens at all, and a
// credentialed refund gives back at most what is still leased, for every
// algorithm that takes refunds, on a bucket all callers share.
func TestRefundsOnlyGiveBackLeases(t *testing.T) {
	algos := []string{"token_bucket", "fixed_window", "sliding_window", "gcra"}
	var toml strings.Builder
	for _, a := range algos {
		fmt.Fprintf(&toml, "[[rules]]\nid = %q\npath = \"/shared/%s\"\nscope = \"global\"\nalgorithm = %q\nlimit = 100\nwindow_seconds = 3600\n\n", "shared_"+a, a, a)
	}
	filter := startService(t, toml.String(), nil)
	open := startServiceOn(t, filter.redis, "redis://"+filter.redis.Addr+"/0", toml.String(), map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	for _, a := range algos {
		t.Run(a, func(t *testing.T) {
			ep := "/shared/" + a
			check := func(s *service, extra string) *response {
				t.Helper()
				return s.do(http.MethodPost, "/v1/rate-limit/check", `{"user_id":"u1","endpoint":"`+ep+`"`+extra+`}`)
			}
			// The tier counts beside the shared rule: a lease over several
			// counters starts on the path's second call.
			if r := check(filter, `,"lease":50`); r.status != 200 || r.json(t)["lease"].(map[string]any)["granted"] != 0.0 {
				t.Fatalf("first lease: %d %s", r.status, r.body)
			}
			// The filter leases: one token spent, a tenth of the 98 left (9) leased.
			r := check(filter, `,"lease":50`)
			lease := r.json(t)["lease"].(map[string]any)
			if r.status != 200 || lease["granted"] != 9.0 || num(t, r.json(t), "remaining") != 89 {
				t.Fatalf("lease: %d %s", r.status, r.body)
			}
			// A window's lease comes with its leased_at, sent back with
			// the tokens (TestLeaseHandBackAfterItsWindow).
			back := `,"returned":1000`
			if at, ok := lease["leased_at"].(float64); ok {
				back += fmt.Sprintf(`,"leased_at":%d`, int64(at))
			} else if a == "fixed_window" || a == "sliding_window" {
				t.Fatalf("a window's lease without a leased_at: %s", r.body)
			}
			before := filter.countersExcept("\x00")
			if r := check(open, `,"returned":1000`); r.status != 403 || r.errorCode(t) != "FORBIDDEN" {
				t.Fatalf("uncredentialed refund: %d %s", r.status, r.body)
			}
			if after := filter.countersExcept("\x00"); after != before {
				t.Fatalf("an uncredentialed refund moved the shared bucket:\n%s\n---\n%s", before, after)
			}
			for i, want := range []int64{
				97, // the 9 leased come back, this check spends 1
				96, // nothing is leased any more: 1000 returned credit nothing
			} {
				if r := check(filter, back); r.status != 200 || num(t, r.json(t), "remaining") != want {
					t.Fatalf("refund %d: %d %s; want %d remaining", i, r.status, r.body, want)
				}
			}
		})
	}
}

// Every spelling of one path is one counter.
func TestEndpointSpellingsShareACounter(t *testing.T) {
	s := startService(t, "", nil)
	for _, ep := range []string{"/api/v1/items", "/api/v1/%69tems", "/api/v1//items", "/api/v1/items;a", "/api/v1/./items", "/api/v1/items/", "/api/v1/items?page=2"} {
		if r := s.check(map[string]any{"user_id": "u", "endpoint": ep}); r.status != 200 {
			t.Fatalf("%s: %d %s", ep, r.status, r.body)
		}
	}
	ks := slices.DeleteFunc(s.rdb.Keys(context.Background(), "rl:{*").Val(), func(k string) bool { return strings.Contains(k, ".total:") })
	if len(ks) != 1 || !strings.Contains(ks[0], ":/api/v1/items:") {
		t.Fatalf("keys %v; want one counter for /api/v1/items (beside the tier's total)", ks)
	}
	r := s.do(http.MethodGet, "/v1/rate-limit/status/u/api/v1/%2569tems", nil)
	if r.status != 200 || num(t, r.json(t), "remaining") != 93 {
		t.Fatalf("status through another spelling: %d %s", r.status, r.body)
	}
	r = s.admin(http.MethodPost, "/v1/rate-limit/reset", `{"user_id":"u","endpoint":"/api/v1/./%69tems/"}`)
	if r.status != 200 || num(t, r.json(t), "keys_deleted") != 2 || r.json(t)["endpoint"] != "/api/v1/items" {
		t.Fatalf("reset through another spelling: %d %s", r.status, r.body)
	}
	if ks := s.rdb.Keys(context.Background(), "rl:{*").Val(); len(ks) != 0 {
		t.Fatalf("keys %v after the reset", ks)
	}
}

// With path_case = "insensitive" (an upstream that routes paths
// case-insensitively) every case of a path is one counter, for a rule, the
// tier and status and reset; case-sensitive (the default) they are apart.
// A rule pattern with an upper-case letter is refused, naming the field.
func TestPathCase(t *testing.T) {
	windowtest.RoomInMinute(t)
	const toml = "[[rules]]\nid = \"orders\"\npath = \"/api/orders\"\nscope = \"identity\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow_seconds = 60\n"
	s := startService(t, "path_case = \"insensitive\"\n"+toml, nil)
	var got []int
	for _, ep := range []string{"/API/Orders", "/api/ORDERS", "/Api/orders"} {
		got = append(got, s.check(map[string]any{"user_id": "u", "endpoint": ep}).status)
	}
	if fmt.Sprint(got) != "[200 200 429]" {
		t.Fatalf("spellings of /api/orders: %v; want [200 200 429]", got)
	}
	for _, ep := range []string{"/Items", "/ITEMS"} {
		s.check(map[string]any{"user_id": "u", "endpoint": ep})
	}
	ks := s.rdb.Keys(context.Background(), "rl:{*").Val()
	slices.Sort(ks)
	if len(ks) != 3 || !strings.Contains(ks[0], ":orders:") || !strings.Contains(ks[1], ".total:") || !strings.Contains(ks[2], ":/items:") {
		t.Fatalf("keys %v; want the rule's counter, the tier's total and one tier counter for /items", ks)
	}
	if r := s.do(http.MethodGet, "/v1/rate-limit/status/u/ITEMS", nil); r.status != 200 || num(t, r.json(t), "remaining") != 98 {
		t.Fatalf("status through upper case: %d %s", r.status, r.body)
	}
	if r := s.admin(http.MethodPost, "/v1/rate-limit/reset", `{"user_id":"u","endpoint":"/API/ORDERS"}`); r.status != 200 || r.json(t)["endpoint"] != "/api/orders" {
		t.Fatalf("reset through upper case: %d %s", r.status, r.body)
	}
	r := s.admin(http.MethodPost, "/admin/v1/rate-limit-rules", map[string]any{"endpoint_pattern": "/Api/v2/**", "limit": 1, "window_seconds": 60})
	if r.status != 400 || !strings.Contains(string(r.body), "endpoint_pattern") || !strings.Contains(string(r.body), "/api/v2/**") {
		t.Fatalf("an upper-case rule pattern: %d %s", r.status, r.body)
	}

	sensitive := startService(t, toml, nil)
	got = got[:0]
	for _, ep := range []string{"/api/orders", "/api/orders", "/API/Orders"} {
		got = append(got, sensitive.check(map[string]any{"user_id": "u", "endpoint": ep}).status)
	}
	if fmt.Sprint(got) != "[200 200 200]" {
		t.Fatalf("case-sensitive: %v; want the upper-case spelling apart", got)
	}
}

// HEAD counts for a rule on GET: servers answer it with the GET handler, so
// it must not walk around the rule. Other methods stay apart.
func TestHeadCountsForAGetRule(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "[[rules]]\nid = \"export\"\npath = \"/export\"\nmethods = [\"GET\"]\nscope = \"identity\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow_seconds = 60\n", nil)
	var got []string
	for _, m := range []string{"GET", "HEAD", "POST"} {
		r := s.check(map[string]any{"user_id": "u", "endpoint": "/export", "method": m})
		got = append(got, fmt.Sprint(r.status, " ", r.json(t)["rule_id"]))
	}
	if want := "[200 export 429 export 200 tier_free]"; fmt.Sprint(got) != want {
		t.Fatalf("GET, HEAD, POST: %v; want %s", got, want)
	}
}

// The worst check the API accepts stays cheap in Redis: measured by Redis
// itself (SLOWLOG records every command when the threshold is 0), not by a
// timer in the test.
func TestWorstAcceptedCheckIsCheapInRedis(t *testing.T) {
	s := startService(t, "[lease]\nmax = 1000000\nfraction = 1.0\n", nil)
	ctx := context.Background()
	if err := s.rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.ConfigSet(ctx, "slowlog-max-len", "10000").Err(); err != nil {
		t.Fatal(err)
	}
	worst := map[string]any{"user_id": "u", "endpoint": "/x", "strategy": "sliding_log", "limit": 1_000_000, "window_seconds": 3600, "cost": 1_000_000}
	// A log of many small entries, then aged past the window, so the next
	// calls have the most to sweep.
	for i := 0; i < 300; i++ {
		if r := s.check(map[string]any{"user_id": "u", "endpoint": "/x", "strategy": "sliding_log", "limit": 1_000_000, "window_seconds": 3600}); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	key := s.rdb.Keys(ctx, "rl:{*sliding_log*").Val()
	if len(key) != 1 {
		t.Fatalf("keys %v", key)
	}
	entries := s.rdb.ZRangeByScore(ctx, key[0], &redis.ZRangeBy{Min: "0", Max: "+inf"}).Val()
	for _, m := range entries {
		s.rdb.ZAdd(ctx, key[0], redis.Z{Score: 1, Member: m})
	}
	s.rdb.SlowLogReset(ctx)
	for i := 0; i < 3; i++ {
		if r := s.check(worst); r.status != 200 && r.status != 429 {
			t.Fatalf("worst check: %d %s", r.status, r.body)
		}
		lease := map[string]any{"user_id": "u", "endpoint": "/x", "strategy": "sliding_log", "limit": 1_000_000, "window_seconds": 3600, "lease": 1_000_000}
		if r := s.check(lease); r.status != 200 && r.status != 429 {
			t.Fatalf("lease check: %d %s", r.status, r.body)
		}
	}
	if n := s.rdb.ZCard(ctx, key[0]).Val(); n > 300 {
		t.Fatalf("the log holds %d entries after calls worth millions of tokens", n)
	}
	logs, err := s.rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// SLOWLOG lists the newest first; the calls alternate worst, lease.
	var durs []int64
	for _, l := range logs {
		if len(l.Args) > 0 && (strings.EqualFold(l.Args[0], "evalsha") || strings.EqualFold(l.Args[0], "eval")) {
			durs = append(durs, l.Duration.Microseconds())
		}
	}
	if len(durs) != 6 {
		t.Fatalf("SLOWLOG holds %d script calls, want 6", len(durs))
	}
	// Each kind of call is judged by its best of three rounds, so that a
	// moment the machine took Redis off the CPU is not read as the script's
	// cost; any call at all past 5 ms is unbounded work whatever the noise.
	best := [2]int64{1 << 62, 1 << 62}
	for i, d := range durs {
		best[i%2] = min(best[i%2], d)
		if d >= 5000 {
			t.Fatalf("a script call took %d µs of Redis time", d)
		}
	}
	t.Logf("script calls (µs, newest first): %v", durs)
	if best[0] >= 500 || best[1] >= 500 {
		t.Fatalf("the worst accepted checks took %d and %d µs of Redis time at best; the bound is well under a millisecond (500 µs)", best[0], best[1])
	}
}

// An idempotency key replays its first answer to the same checks only: other
// checks under it, or the same ones while the first request is still being
// answered, are refused and count nothing.
func TestBatchIdempotencyBoundToChecks(t *testing.T) {
	s := startService(t, "", nil)
	ctx := context.Background()
	first := `{"idempotency_key":"k-7","checks":[{"user_id":"u1","endpoint":"/x","limit":1,"window_seconds":60}]}`
	if r := s.do(http.MethodPost, "/v1/rate-limit/batch-check", first); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	counters := s.countersExcept("\x00") // every counter
	sum := sha256.Sum256([]byte("k-pending"))
	claimed := keys.Idempotency(hex.EncodeToString(sum[:]))
	pending, _ := json.Marshal([]wire.CheckRequest{{UserID: "u3", Endpoint: "/x"}})
	d := sha256.Sum256(pending)
	s.rdb.Set(ctx, claimed, fmt.Sprintf(`{"digest":%q}`, hex.EncodeToString(d[:])), time.Minute)
	for _, tc := range []struct {
		name, body string
		status     int
		replayed   bool
	}{
		{"same checks, other spacing", `{ "checks" : [ {"window_seconds":60, "limit":1, "endpoint":"/x", "user_id":"u1"} ], "idempotency_key":"k-7" }`, 200, true},
		{"another user", `{"idempotency_key":"k-7","checks":[{"user_id":"u2","endpoint":"/x","limit":1,"window_seconds":60}]}`, 409, false},
		{"another limit", `{"idempotency_key":"k-7","checks":[{"user_id":"u1","endpoint":"/x","limit":2,"window_seconds":60}]}`, 409, false},
		{"one more check", `{"idempotency_key":"k-7","checks":[{"user_id":"u1","endpoint":"/x","limit":1,"window_seconds":60},{"user_id":"u1","endpoint":"/y"}]}`, 409, false},
		{"same checks while the first is in flight", `{"idempotency_key":"k-pending","checks":[{"user_id":"u3","endpoint":"/x"}]}`, 409, false},
		{"other checks while the first is in flight", `{"idempotency_key":"k-pending","checks":[{"user_id":"u4","endpoint":"/x"}]}`, 409, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.do(http.MethodPost, "/v1/rate-limit/batch-check", tc.body)
			if r.status != tc.status {
				t.Fatalf("%d %s; want %d", r.status, r.body, tc.status)
			}
			if tc.status == 409 && r.errorCode(t) != "IDEMPOTENCY_KEY_REUSED" {
				t.Fatalf("code %s", r.body)
			}
			if tc.replayed && r.json(t)["replayed"] != true {
				t.Fatalf("not a replay: %s", r.body)
			}
			if after := s.countersExcept("\x00"); after != counters {
				t.Fatalf("counters moved:\n%s\n---\n%s", counters, after)
			}
		})
	}
}

// An API key does not walk around a per-address rule (a login brute-force
// limit), and a user's keys share the user's limit: the ip scope counts a key
// caller's client address and the user scope the key's user.
func TestKeyCallersCountForAddressAndUserRules(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, `[[rules]]
id = "login"
path = "/api/v1/auth/login"
scope = "ip"
algorithm = "fixed_window"
limit = 2
window_seconds = 60
[[rules]]
id = "per_user"
path = "/api/v1/reports"
scope = "user"
algorithm = "fixed_window"
limit = 3
window_seconds = 60
`, nil)
	key := func(user string) string {
		r := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": user, "tier": "free"})
		if r.status != 201 {
			t.Fatalf("create key: %d %s", r.status, r.body)
		}
		return r.json(t)["api_key"].(string)
	}
	k1, k2, other := key("alice"), key("alice"), key("bob")
	check := func(addr, apiKey, path string) *response {
		return s.check(map[string]any{"user_id": "ip:" + addr, "api_key": apiKey, "endpoint": path})
	}
	for _, tt := range []struct {
		name       string
		addr, key  string
		path       string
		wantStatus int
		wantRule   string
	}{
		{"anonymous, first", "192.0.2.7", "", "/api/v1/auth/login", 200, ""},
		{"alice's key from the same address", "192.0.2.7", k1, "/api/v1/auth/login", 200, ""},
		{"bob's key from the same address: the address is spent", "192.0.2.7", other, "/api/v1/auth/login", 429, "login"},
		{"a key from another address", "192.0.2.8", k1, "/api/v1/auth/login", 200, ""},
		{"alice's first key", "198.51.100.1", k1, "/api/v1/reports", 200, ""},
		{"alice's second key", "198.51.100.2", k2, "/api/v1/reports", 200, ""},
		{"alice's first key again", "198.51.100.3", k1, "/api/v1/reports", 200, ""},
		{"alice's second key: the user's limit is spent", "198.51.100.4", k2, "/api/v1/reports", 429, "per_user"},
		{"bob has his own", "198.51.100.5", other, "/api/v1/reports", 200, ""},
	} {
		r := check(tt.addr, tt.key, tt.path)
		if r.status != tt.wantStatus || (tt.wantRule != "" && r.json(t)["rule_id"] != tt.wantRule) {
			t.Errorf("%s: %d %s; want %d by rule %q", tt.name, r.status, r.body, tt.wantStatus, tt.wantRule)
		}
	}
}

// Guessing API keys, or replaying a revoked one, is not free: a request
// refused for its key counts for its client address like an anonymous one,
// so once the address is spent the answer is 429, and a valid key from
// elsewhere is not touched.
func TestRefusedKeysCountForTheirAddress(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 3\nwindow_seconds = 60\n", nil)
	valid := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "alice", "tier": "free"}).json(t)["api_key"].(string)
	revoked := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "bob", "tier": "free"}).json(t)["api_key"].(string)
	if r := s.admin("POST", "/admin/v1/api-keys/"+revoked+"/revoke", nil); r.status != 200 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	guess := "ak_live_" + strings.Repeat("A", len(valid)-len("ak_live_"))
	check := func(addr, key string) *response {
		return s.check(map[string]any{"user_id": "ip:" + addr, "api_key": key, "endpoint": "/api/v1/items"})
	}
	for i, tt := range []struct {
		addr, key string
		status    int
		code      string
	}{
		{"192.0.2.50", guess, 401, "INVALID_API_KEY"},
		{"192.0.2.50", "ak_live_short", 400, "INVALID_API_KEY"},
		{"192.0.2.50", revoked, 403, "API_KEY_REVOKED"},
		{"192.0.2.50", guess, 429, "RATE_LIMIT_EXCEEDED"}, // the address's three are spent
		{"192.0.2.50", revoked, 429, "RATE_LIMIT_EXCEEDED"},
		{"192.0.2.51", guess, 401, "INVALID_API_KEY"}, // another address has its own
		{"192.0.2.50", valid, 200, ""},                // a valid key is counted by its key
	} {
		r := check(tt.addr, tt.key)
		if r.status != tt.status || (tt.code != "" && r.errorCode(t) != tt.code) {
			t.Errorf("attempt %d (%s): %d %s; want %d %s", i, tt.addr, r.status, r.body, tt.status, tt.code)
		}
	}
	// Refused requests were counted, never admitted: the address's usage
	// shows no request made and the two denials as violations.
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	u := s.admin("GET", "/admin/v1/usage/ip:192.0.2.50?window=current", nil).json(t)
	cw, _ := u["current_window"].(map[string]any)
	day, _ := u["last_24_hours"].(map[string]any)
	if cw == nil || cw["requests_made"] != float64(0) || day["violations"] != float64(2) {
		t.Fatalf("usage of the guessing address: %v", u)
	}
	// A verified subject's refused keys count for the address it came
	// from, as anonymous requests from there.
	for i, want := range []int{401, 401, 401, 429} {
		if r := s.check(map[string]any{"user_id": "user:carol", "client_address": "192.0.2.60", "api_key": guess, "endpoint": "/api/v1/items"}); r.status != want {
			t.Fatalf("a subject's refused key %d: %d %s; want %d", i, r.status, r.body, want)
		}
	}
	if r := check("192.0.2.60", guess); r.status != 429 {
		t.Fatalf("the subject's address after its refused keys: %d %s", r.status, r.body)
	}
	if r := s.check(map[string]any{"user_id": "user:carol", "endpoint": "/api/v1/items"}); r.status != 200 {
		t.Fatalf("the subject itself, without a key: %d %s", r.status, r.body)
	}
	// A caller with no address the filter knows is refused without counting.
	before := s.dbsize()
	for i := 0; i < 5; i++ {
		if r := s.check(map[string]any{"user_id": "ip:unknown", "api_key": guess, "endpoint": "/api/v1/items"}); r.status != 401 {
			t.Fatalf("unknown address: %d %s", r.status, r.body)
		}
	}
	if after := s.dbsize(); after != before {
		t.Fatalf("refusals of an unknown address wrote %d keys", after-before)
	}
}

// A verified JWT subject does not walk around a per-address rule either:
// the filter sends its client address, and the ip scope counts it. Only the
// filter may say where a caller is.
func TestJWTCallersCountForAddressRules(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, `[[rules]]
id = "login"
path = "/api/v1/auth/login"
scope = "ip"
algorithm = "fixed_window"
limit = 2
window_seconds = 60
`, nil)
	check := func(user, addr string) *response {
		return s.check(map[string]any{"user_id": user, "client_address": addr, "endpoint": "/api/v1/auth/login"})
	}
	for _, tt := range []struct {
		name, user, addr string
		status           int
		field            string
	}{
		{"alice from an address", "user:alice", "192.0.2.9", 200, ""},
		{"bob from the same address", "user:bob", "192.0.2.9", 200, ""},
		{"carol from the same address: it is spent", "user:carol", "192.0.2.9", 429, ""},
		{"carol from another address", "user:carol", "2001:db8::9", 200, ""},
		{"an address that is not one", "user:carol", "192.0.2.300", 400, "client_address"},
		{"an address caller naming another address", "ip:198.51.100.1", "192.0.2.10", 400, "client_address"},
	} {
		r := check(tt.user, tt.addr)
		if r.status != tt.status {
			t.Errorf("%s: %d %s; want %d", tt.name, r.status, r.body, tt.status)
			continue
		}
		if tt.field != "" {
			if f := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"]; f != tt.field {
				t.Errorf("%s: field %v, want %s", tt.name, f, tt.field)
			}
		}
	}
	// Without the filter's credential nobody may say where a caller is.
	open := startServiceOn(t, s.redis, "redis://"+s.redis.Addr+"/0", "", map[string]string{"TOLLGATE_DECISION_TOKEN": ""})
	if r := open.check(map[string]any{"user_id": "mallory", "client_address": "192.0.2.77", "endpoint": "/api/v1/auth/login"}); r.status != 403 ||
		r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"] != "client_address" {
		t.Fatalf("untrusted client_address: %d %s", r.status, r.body)
	}
}

// Ten JWT subjects sharing one premium key used to get the key's tier ten
// times over while the key's counters never moved: the key is charged now,
// so together they get the key's limit, and its usage shows every request.
func TestJWTSubjectsSharingAKeyChargeTheKey(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 2\nwindow_seconds = 60\n[[tiers]]\nname = \"premium\"\nlimit = 5\nwindow_seconds = 60\n", nil)
	raw := s.admin("POST", "/admin/v1/api-keys", map[string]any{"user_id": "owner", "tier": "premium"}).json(t)["api_key"].(string)
	admitted := 0
	for i := 0; i < 10; i++ {
		for j := 0; j < 5; j++ {
			r := s.check(map[string]any{"user_id": fmt.Sprintf("user:subject%d", i), "endpoint": "/x", "api_key": raw, "client_address": "192.0.2.1"})
			switch r.status {
			case 200:
				admitted++
				if r.json(t)["tier"] != "premium" {
					t.Fatalf("tier %v", r.json(t)["tier"])
				}
			case 429:
			default:
				t.Fatalf("%d %s", r.status, r.body)
			}
		}
	}
	if admitted != 5 {
		t.Fatalf("ten subjects sharing a premium key (5 a minute) got %d of 50", admitted)
	}
	if err := s.app.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	u := s.admin("GET", "/admin/v1/usage/"+url.PathEscape(raw)+"?window=current", nil).json(t)
	if made := u["current_window"].(map[string]any)["requests_made"]; made != 5.0 {
		t.Fatalf("the key's usage shows %v requests, want the 5 admitted", made)
	}
}

// A caller walking distinct long paths used to add each whole path to Redis
// (8.3 KB a request): a counter's key names a long path by a digest, and
// what one caller creates is bounded by its tier's total (a refused request
// writes nothing). Status still answers with the readable path.
func TestLongPathsCostRedisLittle(t *testing.T) {
	s := startService(t, "[[tiers]]\nname = \"free\"\nlimit = 2\nwindow_seconds = 60\ntotal_limit = 10\n", nil)
	ctx := context.Background()
	long := func(i int) string { return fmt.Sprintf("/api/%d/%s", i, strings.Repeat("a", 8000)) }
	for i := 0; i < 50; i++ {
		if r := s.check(map[string]any{"user_id": "ip:192.0.2.50", "endpoint": long(i)}); r.status != 200 && r.status != 429 {
			t.Fatalf("%d %s", r.status, r.body[:min(len(r.body), 200)])
		}
	}
	ks := s.rdb.Keys(ctx, "rl:{*").Val()
	if len(ks) > 11 {
		t.Fatalf("50 long paths made %d keys; the tier's total (10) bounds them", len(ks))
	}
	total := 0
	for _, k := range ks {
		total += len(k) + len(s.rdb.Get(ctx, k).Val())
	}
	if total > 11*200 {
		t.Fatalf("%d keys hold %d bytes of names and values; want a few hundred each", len(ks), total)
	}
	r := s.do(http.MethodGet, "/v1/rate-limit/status/ip:192.0.2.50"+long(0), nil)
	if r.status != 200 || r.json(t)["endpoint"] != long(0) || num(t, r.json(t), "remaining") != 0 {
		t.Fatalf("status of a long path: %d %.300s", r.status, r.body)
	}
}
