package app_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

// Every bad request gets its status and envelope, and leaves Redis untouched.
func TestBadInput(t *testing.T) {
	s := startService(t, "", nil)
	big := `{"user_id":"x","endpoint":"/x","pad":"` + strings.Repeat("a", 1<<20) + `"}`
	tests := []struct {
		name   string
		path   string
		body   any
		status int
		code   string
		field  string
	}{
		{"malformed json", "/v1/rate-limit/check", `{"user_id": "x",`, 400, "INVALID_INPUT", "body"},
		{"not an object", "/v1/rate-limit/check", `[1,2]`, 400, "INVALID_INPUT", "body"},
		{"empty body", "/v1/rate-limit/check", ``, 400, "INVALID_INPUT", "body"},
		{"trailing data", "/v1/rate-limit/check", `{"user_id":"x","endpoint":"/x"} {}`, 400, "INVALID_INPUT", "body"},
		{"wrong type", "/v1/rate-limit/check", `{"user_id": 42, "endpoint": "/x"}`, 400, "INVALID_INPUT", "user_id"},
		{"wrong type number", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "cost": "lots"}`, 400, "INVALID_INPUT", "cost"},
		{"missing user", "/v1/rate-limit/check", `{"endpoint": "/x"}`, 400, "INVALID_INPUT", "user_id"},
		{"missing endpoint", "/v1/rate-limit/check", `{"user_id": "x"}`, 400, "INVALID_INPUT", "endpoint"},
		{"relative endpoint", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "api"}`, 400, "INVALID_INPUT", "endpoint"},
		{"unknown strategy", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "strategy": "leaky_bucket"}`, 400, "INVALID_STRATEGY", "strategy"},
		{"zero limit", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "limit": 0}`, 400, "INVALID_LIMIT", "limit"},
		{"negative limit", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "limit": -5}`, 400, "INVALID_LIMIT", "limit"},
		{"window too long", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "limit": 5, "window_seconds": 86400}`, 400, "INVALID_LIMIT", "window_seconds"},
		{"negative cost", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "cost": -1}`, 400, "INVALID_INPUT", "cost"},
		{"cost above capacity", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "cost": 101}`, 400, "INVALID_INPUT", "cost"},
		{"negative lease", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "lease": -1}`, 400, "INVALID_INPUT", "lease"},
		{"negative charge_returned", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "charge_returned": -1}`, 400, "INVALID_INPUT", "charge_returned"},
		{"huge charge_returned", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "charge_returned": 1000000001}`, 400, "INVALID_INPUT", "charge_returned"},
		{"negative leased_at", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "returned": 1, "leased_at": -1}`, 400, "INVALID_INPUT", "leased_at"},
		{"huge leased_at", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "returned": 1, "leased_at": 9007199254740993}`, 400, "INVALID_INPUT", "leased_at"},
		{"leased_at a string", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "leased_at": "soon"}`, 400, "INVALID_INPUT", "leased_at"},
		{"leased_at 1e300", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "leased_at": 1e300}`, 400, "INVALID_INPUT", "leased_at"},
		{"negative charge_leased_at", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "charge_leased_at": -2}`, 400, "INVALID_INPUT", "charge_leased_at"},
		{"charge_leased_at a float", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "charge_leased_at": 1.5}`, 400, "INVALID_INPUT", "charge_leased_at"},
		{"lease_charges not a boolean", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "lease_charges": "yes"}`, 400, "INVALID_INPUT", "lease_charges"},
		{"bad tier", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "tier": "Gold Tier"}`, 400, "INVALID_INPUT", "tier"},
		{"bad method", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x", "method": "get\r\n"}`, 400, "INVALID_INPUT", "method"},
		{"crlf identity", "/v1/rate-limit/check", `{"user_id": "user:alice\r\nX-Evil: 1", "endpoint": "/x"}`, 400, "INVALID_INPUT", "user_id"},
		{"nul identity", "/v1/rate-limit/check", `{"user_id": "alice\u0000", "endpoint": "/x"}`, 400, "INVALID_INPUT", "user_id"},
		{"10 kB identity", "/v1/rate-limit/check", `{"user_id": "` + strings.Repeat("a", 10_000) + `", "endpoint": "/x"}`, 400, "INVALID_INPUT", "user_id"},
		{"bad ip identity", "/v1/rate-limit/check", `{"user_id": "ip:999.1.1.1", "endpoint": "/x"}`, 400, "INVALID_INPUT", "user_id"},
		{"crlf endpoint", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/x\r\nHost: evil"}`, 400, "INVALID_INPUT", "endpoint"},
		{"huge endpoint", "/v1/rate-limit/check", `{"user_id": "x", "endpoint": "/` + strings.Repeat("a", 9000) + `"}`, 400, "INVALID_INPUT", "endpoint"},
		{"body over 1 MiB", "/v1/rate-limit/check", big, 413, "PAYLOAD_TOO_LARGE", ""},
		{"empty batch", "/v1/rate-limit/batch-check", `{"checks": []}`, 400, "INVALID_INPUT", "checks"},
		{"batch over 100", "/v1/rate-limit/batch-check", `{"checks": [` + strings.Repeat(`{"user_id":"x","endpoint":"/x"},`, 100) + `{"user_id":"x","endpoint":"/x"}]}`, 400, "INVALID_INPUT", "checks"},
		{"huge idempotency key", "/v1/rate-limit/batch-check", `{"idempotency_key": "` + strings.Repeat("k", 300) + `", "checks": [{"user_id":"x","endpoint":"/x"}]}`, 400, "INVALID_INPUT", "idempotency_key"},
		{"unknown route", "/v1/rate-limit/nope", `{}`, 404, "NOT_FOUND", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.do(http.MethodPost, tt.path, tt.body)
			if r.status != tt.status || r.errorCode(t) != tt.code {
				t.Fatalf("%d %s; want %d %s", r.status, truncate(r.body), tt.status, tt.code)
			}
			if tt.field != "" {
				if f := r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"]; f != tt.field {
					t.Fatalf("details.field %v, want %s", f, tt.field)
				}
			}
			if n := s.dbsize(); n != 0 {
				t.Fatalf("a rejected request left %d keys in Redis", n)
			}
		})
	}
}

// Admin bodies are strict: an unknown (misspelt) field is refused by name.
func TestAdminRefusesUnknownFields(t *testing.T) {
	s := startService(t, "", nil)
	r := s.admin("PUT", "/v1/rate-limit/config", `{"user_id":"u","endpoint":"/x","limit":5,"window_seconds":60,"strategy":"gcra","burst_capacty":9}`)
	if r.status != 400 || r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"] != "burst_capacty" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The decision API is as strict (upgrade the service before the
	// filter when a release adds a field).
	if r := s.check(`{"user_id":"u","endpoint":"/x","from_the_future":true}`); r.status != 400 || r.json(t)["error"].(map[string]any)["details"].(map[string]any)["field"] != "from_the_future" {
		t.Fatalf("check with an unknown field: %d %s", r.status, r.body)
	}
}

// Braces cannot move a caller's counter to another owner's slot, and two
// identities that differ only in escaping get two counters.
func TestHostileBracesAreEscaped(t *testing.T) {
	s := startService(t, "", nil)
	for _, id := range []string{"evil}{user:victim", "evil%7D%7Buser:victim"} {
		if r := s.check(map[string]any{"user_id": id, "endpoint": "/x"}); r.status != 200 {
			t.Fatalf("%q: %d %s", id, r.status, r.body)
		}
	}
	ks := s.rdb.Keys(context.Background(), "rl:*").Val()
	if len(ks) != 4 {
		t.Fatalf("keys %v; want one path counter and one tier total per identity", ks)
	}
	victim := keys.Slot(keys.Counter(keys.NewOwner("identity", "user:victim"), "tier_free", "/x", "token_bucket", 60))
	for _, k := range ks {
		if keys.Slot(k) == victim && !strings.Contains(k, "%7D") {
			t.Fatalf("key %s shares the victim's slot through an unescaped tag", k)
		}
	}
}

func truncate(b []byte) []byte {
	if len(b) > 300 {
		return append(bytes.Clone(b[:300]), "..."...)
	}
	return b
}

// An error quotes little of its input: a 900 KB number came back as a 1.8 MB
// answer.
func TestErrorsQuoteLittle(t *testing.T) {
	s := startService(t, "", nil)
	huge := strings.Repeat("9", 900_000)
	for _, body := range []string{
		`{"user_id":"u","endpoint":"/x","limit":` + huge + `}`,
		`{"user_id":"u","endpoint":"/x","limit":"` + huge + `"}`,
		`{"user_id":"u","endpoint":"/x","` + huge + `":1}`,
		`{"user_id":"` + strings.Repeat("\u202e", 300_000) + `","endpoint":"/x"}`,
	} {
		r := s.check(body)
		if r.status != 400 || len(r.body) > 2048 {
			t.Fatalf("%.40s...: %d, %d bytes: %.200s", body, r.status, len(r.body), r.body)
		}
	}
}
