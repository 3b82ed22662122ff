package wire

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestDescribeJSONError(t *testing.T) {
	for body, want := range map[string][2]string{
		`{"user_id": 1}`:     {"user_id", "must be a string, not number"},
		`{"cost": "x"}`:      {"cost", "must be a number, not string"},
		`{"user_id": "a",`:   {"body", "malformed JSON (truncated)"},
		`{"user_id" "a"}`:    {"body", "malformed JSON at byte 12"},
		`{"surprise": true}`: {"surprise", "is not a known field"},
	} {
		dec := json.NewDecoder(bytes.NewReader([]byte(body)))
		dec.DisallowUnknownFields()
		var r CheckRequest
		err := dec.Decode(&r)
		if err == nil {
			t.Fatalf("%s decoded", body)
		}
		if f, why := DescribeJSONError(err); f != want[0] || why != want[1] {
			t.Errorf("%s: %q %q, want %q %q", body, f, why, want[0], want[1])
		}
	}
}
