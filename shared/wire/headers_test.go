package wire

import (
	"reflect"
	"testing"
)

func TestAppendHeaders(t *testing.T) {
	l := Limits{RuleID: "tier_free", Strategy: "token_bucket", Limit: 100, Remaining: 7, ResetAt: 1060, WindowSeconds: 60, RetryAfter: 9}
	tests := []struct {
		name   string
		l      Limits
		set    HeaderSet
		denied bool
		want   [][2]string
	}{
		{"none", l, HeaderSet{}, false, nil},
		{"x-ratelimit", l, HeaderSet{XRateLimit: true}, false, [][2]string{
			{"x-ratelimit-limit", "100"}, {"x-ratelimit-remaining", "7"}, {"x-ratelimit-reset", "1060"}, {"x-ratelimit-window", "60"}}},
		{"with strategy", l, HeaderSet{XRateLimit: true, Strategy: true}, false, [][2]string{
			{"x-ratelimit-limit", "100"}, {"x-ratelimit-remaining", "7"}, {"x-ratelimit-reset", "1060"}, {"x-ratelimit-window", "60"}, {"x-ratelimit-strategy", "token_bucket"}}},
		{"ietf allowed counts to the reset", l, HeaderSet{IETF: true}, false, [][2]string{
			{"ratelimit-policy", `"tier_free";q=100;w=60`}, {"ratelimit", `"tier_free";r=7;t=60`}}},
		{"ietf denied counts the retry wait", l, HeaderSet{IETF: true}, true, [][2]string{
			{"ratelimit-policy", `"tier_free";q=100;w=60`}, {"ratelimit", `"tier_free";r=7;t=9`}}},
		{"negative remaining and past reset", Limits{RuleID: "r", Limit: 5, Remaining: -3, ResetAt: 10, WindowSeconds: 1}, HeaderSet{XRateLimit: true, IETF: true}, false, [][2]string{
			{"x-ratelimit-limit", "5"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "10"}, {"x-ratelimit-window", "1"},
			{"ratelimit-policy", `"r";q=5;w=1`}, {"ratelimit", `"r";r=0;t=0`}}},
		{"a burst: the limit is the bucket, the policy the sustained rate", Limits{RuleID: "b", Limit: 9, Quota: 3, Remaining: 9, ResetAt: 1000, WindowSeconds: 60}, HeaderSet{XRateLimit: true, IETF: true}, false, [][2]string{
			{"x-ratelimit-limit", "9"}, {"x-ratelimit-remaining", "9"}, {"x-ratelimit-reset", "1000"}, {"x-ratelimit-window", "60"},
			{"ratelimit-policy", `"b";q=3;w=60`}, {"ratelimit", `"b";r=9;t=0`}}},
		{"rule id is quoted, not spliced", Limits{RuleID: "a\";q=1", Limit: 5}, HeaderSet{IETF: true}, false, [][2]string{
			{"ratelimit-policy", `"a\";q=1";q=5;w=0`}, {"ratelimit", `"a\";q=1";r=0;t=0`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendHeaders(nil, &tt.l, tt.set, 1000, tt.denied)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("AppendHeaders =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// AppendHeaderFields renders what AppendHeaders returns, appending to what
// the buffer already holds, and allocates nothing into a buffer with room.
func TestAppendHeaderFields(t *testing.T) {
	l := Limits{RuleID: "tier \"free\"", Strategy: "gcra", Limit: 1 << 40, Quota: 3, Remaining: -1, ResetAt: 1060, WindowSeconds: 3600, RetryAfter: 9}
	for _, set := range []HeaderSet{{}, {XRateLimit: true}, {IETF: true}, {XRateLimit: true, Strategy: true, IETF: true}} {
		for _, denied := range []bool{false, true} {
			want := AppendHeaders(nil, &l, set, 1000, denied)
			buf, fields := AppendHeaderFields([]byte("kept"), nil, &l, set, 1000, denied)
			if string(buf[:4]) != "kept" || len(fields) != len(want) {
				t.Fatalf("%+v: %q %v", set, buf, fields)
			}
			for i, f := range fields {
				if f.Name != want[i][0] || string(f.Value(buf)) != want[i][1] {
					t.Fatalf("%+v field %d: %s=%q, want %q", set, i, f.Name, f.Value(buf), want[i])
				}
			}
		}
	}
	buf := make([]byte, 0, 256)
	fields := make([]HeaderField, 0, MaxHeaderFields)
	set := HeaderSet{XRateLimit: true, Strategy: true, IETF: true}
	if n := testing.AllocsPerRun(100, func() { AppendHeaderFields(buf, fields, &l, set, 1000, false) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
