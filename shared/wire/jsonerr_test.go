//go:build !wasip1

package wire

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

func TestDecode(t *testing.T) {
	type inner struct {
		Requests int64 `json:"request"`
	}
	type conf struct {
		Lease  inner            `json:"lease"`
		Limits map[string]inner `json:"limits"`
		List   []inner          `json:"list"`
		At     time.Time        `json:"at"`
		CheckRequest
	}
	for _, tt := range []struct {
		body          string
		strict        bool
		field, reason string
	}{
		{`{"user_id": 1}`, false, "user_id", "must be a string, not number"},
		{`{"cost": "x"}`, false, "cost", "must be a number, not string"},
		{`{"user_id": "a",`, false, "", "malformed JSON (truncated)"},
		{`{"user_id" "a"}`, false, "", "malformed JSON at byte 12"},
		{`{} {}`, false, "", "has data after the JSON value"},
		// time.Time decodes itself and encoding/json names no field: the
		// first time field holding a bad time is named.
		{`{"at": "2030-01-01"}`, true, "at", `is not a time in RFC 3339 (2006-01-02T15:04:05Z07:00): "2030-01-01"`},
		{`{"surprise": true}`, false, "", ""},
		{`{"surprise": true}`, true, "surprise", "is not a known field"},
		{`{"lease": {"requests": 5}}`, true, "lease.requests", "is not a known field"},
		{`{"limits": {"a": {"request": 1, "x": 2}}}`, true, `limits["a"].x`, "is not a known field"},
		{`{"list": [{}, {"nope": 1}]}`, true, "list[1].nope", "is not a known field"},
		// Strict keys are spelled as their fields: encoding/json alone
		// would take "USER_ID" for user_id, and the last of two copies.
		{`{"USER_ID": "a", "endpoint": "/x"}`, false, "", ""},
		{`{"USER_ID": "a", "endpoint": "/x"}`, true, "USER_ID", "is not a known field"},
		{`{"lease": {"REQUEST": 1}}`, true, "lease.REQUEST", "is not a known field"},
		{`{"user_id": "a", "user_id": "b"}`, true, "user_id", "is given twice"},
		{`{"lease": {"request": 1, "request": 9}}`, true, "lease.request", "is given twice"},
		{`{"list": [{"request": 1}, {"request": 2, "request": 3}]}`, true, "list[1].request", "is given twice"},
		{`{"limits": {"a": {}, "a": {}}}`, true, "limits.a", "is given twice"},
		{`{"limits": {"a": {}, "A": {}}}`, true, "", ""}, // map keys are case-significant (paths)
	} {
		// A type error is reported against a plain request (encoding/json
		// names an embedded struct in its path); key checks against conf,
		// whose embedded fields are promoted.
		var err error
		if strings.Contains(tt.reason, "must be") {
			var r CheckRequest
			err = Decode([]byte(tt.body), &r, tt.strict)
		} else {
			var c conf
			err = Decode([]byte(tt.body), &c, tt.strict)
		}
		if tt.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.body, err)
			}
			continue
		}
		fe, ok := fielderr.As(err)
		if !ok || fe.Field != tt.field || fe.Reason != tt.reason {
			t.Errorf("%s (strict %v): %v; want %q %q", tt.body, tt.strict, err, tt.field, tt.reason)
		}
	}
}

// FuzzDecode: whatever the body, Decode returns nil or a field error, and an
// unknown key is named by a path no longer than the body allows.
func FuzzDecode(f *testing.F) {
	f.Add(`{"checks":[{"user_id":"a","x":1}]}`, true)
	f.Add(`{"lease":{"granted":1,"ttl_ms":2,"z":3}}`, true)
	f.Fuzz(func(t *testing.T, body string, strict bool) {
		var r BatchCheckRequest
		err := Decode([]byte(body), &r, strict)
		if err == nil {
			return
		}
		fe, ok := fielderr.As(err)
		if !ok {
			t.Fatalf("%q: %T %v is not a field error", body, err, err)
		}
		// A path is built from the body's own keys: never longer than
		// their quoted form.
		if fe.Reason == "is not a known field" && (fe.Field == "" || len(fe.Field) > 8*len(body)+8) {
			t.Fatalf("%q: unknown-field path %q", body, fe.Field)
		}
	})
}
