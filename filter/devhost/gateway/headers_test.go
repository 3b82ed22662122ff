package gateway

import (
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"testing"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
)

// Header maps cross both ways without losing a field, a repeat or an
// unusual name.
func TestHeadersRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   http.Header
	}{
		{"common", http.Header{"Content-Type": {"text/plain"}, "X-Forwarded-For": {"10.0.0.1"}}},
		{"repeated", http.Header{"Set-Cookie": {"a=1", "b=2", "c=3"}, "Vary": {"Accept"}}},
		{"uncommon", http.Header{"X-Some-Vendor-Header": {"v"}, "Www-Authenticate": {"Bearer"}}},
		{"empty value", http.Header{"X-Empty": {""}}},
		{"none", http.Header{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pairs := appendHeaders(wasmhost.Headers{{":status", "200"}}, tc.in)
			for _, kv := range pairs[1:] {
				if kv[0] != lowerName(kv[0]) || kv[0] == "" {
					t.Fatalf("name %q is not lower case", kv[0])
				}
			}
			out := httpHeaders(pairs)
			if _, ok := out[":status"]; ok {
				t.Fatal("a pseudo-header reached net/http")
			}
			if len(tc.in) == 0 && len(out) == 0 {
				return
			}
			if !reflect.DeepEqual(out, tc.in) {
				t.Fatalf("round trip: %v, want %v", out, tc.in)
			}
		})
	}
}

// A repeat appended after the shared array is filled leaves the other
// fields' values alone.
func TestHTTPHeadersRepeatKeepsOthers(t *testing.T) {
	out := httpHeaders(wasmhost.Headers{{"a", "1"}, {"b", "2"}, {"a", "3"}, {"c", "4"}})
	want := http.Header{"A": {"1", "3"}, "B": {"2"}, "C": {"4"}}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("%v, want %v", out, want)
	}
	out["B"] = append(out["B"], "x")
	if !slices.Equal(out["C"], []string{"4"}) {
		t.Fatalf("appending to one field changed another: %v", out)
	}
}

func TestRequestIDIsAVersion4UUID(t *testing.T) {
	shape := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newRequestID()
		if !shape.MatchString(id) {
			t.Fatalf("%q is not a version 4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("%q repeated", id)
		}
		seen[id] = true
	}
}
