package apierr

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// An answer quotes at most MaxMessage bytes of message and MaxDetail of each
// detail, cut on a character boundary; short ones pass as they are.
func TestBodyBoundsWhatItQuotes(t *testing.T) {
	huge := strings.Repeat("9", 900_000)
	e := Invalid("limit", huge+" is not an integer")
	e.Details["value"] = strings.Repeat("é", 1000)
	b := e.Body()
	if len(b.Message) > MaxMessage || !strings.HasPrefix(b.Message, "invalid limit: 999") || !strings.HasSuffix(b.Message, "bytes)") {
		t.Fatalf("message of %d bytes: %.80q...", len(b.Message), b.Message)
	}
	for k, v := range b.Details {
		if s := v.(string); len(s) > MaxDetail || !utf8.ValidString(s) {
			t.Fatalf("detail %s of %d bytes (valid UTF-8 %v)", k, len(s), utf8.ValidString(s))
		}
	}
	if b.Details["field"] != "limit" || len(e.Details["value"].(string)) != 2000 {
		t.Fatalf("short details changed or the error's own map was cut: %v", b.Details["field"])
	}
	short := Invalid("tier", "must match ^[a-z0-9_]+$").Body()
	if short.Message != "invalid tier: must match ^[a-z0-9_]+$" {
		t.Fatalf("short message changed: %q", short.Message)
	}
}

// A bad value is answered with its field's code wherever it is refused.
func TestInvalidValueCodes(t *testing.T) {
	for field, want := range map[string]string{
		"limit": "INVALID_LIMIT", "window_seconds": "INVALID_LIMIT", "burst": "INVALID_LIMIT", "burst_capacity": "INVALID_LIMIT",
		"total_limit": "INVALID_LIMIT", `endpoints["/x"]`: "INVALID_LIMIT", "algorithm": "INVALID_STRATEGY", "strategy": "INVALID_STRATEGY",
		"name": "INVALID_INPUT", "endpoint_pattern": "INVALID_INPUT",
	} {
		if got := InvalidValue(field, "bad").Code; got != want {
			t.Errorf("%s: %s, want %s", field, got, want)
		}
	}
}
