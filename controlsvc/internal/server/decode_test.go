package server

import (
	"errors"
	"net/url"
	"testing"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		body   string
		strict bool
		field  string // "" = accepted
	}{
		{`{"user_id":"a","endpoint":"/x"}`, false, ""},
		{`{"user_id":"a","endpoint":"/x","extra":1}`, false, ""},
		{`{"user_id":"a","endpoint":"/x","extra":1}`, true, "extra"},
		{`{"user_id":1}`, false, "user_id"},
		{`{"lease":"many"}`, false, "lease"},
		{`{"limit":1.5}`, false, "limit"},
		{`{`, false, "body"},
		{`   `, false, "body"},
		{`{} {}`, false, "body"},
		{`null`, false, ""},
		{`"text"`, false, "body"},
	}
	for _, tt := range tests {
		var req wire.CheckRequest
		err := decodeJSON([]byte(tt.body), &req, tt.strict)
		var ae *apierr.Error
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: refused: %v", tt.body, err)
		case tt.field != "" && (!errors.As(err, &ae) || ae.Details["field"] != tt.field || httpStatus(ae) != 400):
			t.Errorf("%s: got %v; want a 400 naming %q", tt.body, err, tt.field)
		}
	}
}

func FuzzDecodeCheck(f *testing.F) {
	f.Add([]byte(`{"user_id":"a","endpoint":"/x","limit":5}`), false)
	f.Add([]byte(`{"checks":[{"user_id":"a"}]}`), true)
	f.Fuzz(func(t *testing.T, body []byte, strict bool) {
		var req wire.CheckRequest
		if err := decodeJSON(body, &req, strict); err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || httpStatus(ae) != 400 || ae.Code != wire.CodeInvalidInput {
				t.Fatalf("decode error is not a 400 INVALID_INPUT: %v", err)
			}
		}
		var batch wire.BatchCheckRequest
		_ = decodeJSON(body, &batch, strict)
	})
}

// FuzzStatusQuery: the status route's query is read or refused, never
// half-read: a refusal names a parameter, an acceptance sets only known ones.
func FuzzStatusQuery(f *testing.F) {
	for _, s := range []string{"method=GET&tier=free", "limit=5&window_seconds=60&strategy=gcra", "colour=red", "tier=a&tier=b", "limit=x", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		var req wire.StatusRequest
		if err := statusQuery(q, &req); err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || httpStatus(ae) != 400 || ae.Details["field"] == "" {
				t.Fatalf("refusal %v", err)
			}
			return
		}
		for k := range q {
			switch k {
			case "method", "tier", "tenant", "strategy", "limit", "window_seconds":
			default:
				t.Fatalf("accepted unknown parameter %q", k)
			}
		}
	})
}
