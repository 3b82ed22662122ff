//go:build !wasip1

package wire

import (
	"encoding/json"
	"fmt"
	"testing"
)

func ExampleExceeded() {
	body := Exceeded(&Limits{Limit: 1000, WindowSeconds: 60, ResetAt: 1735689720, RetryAfter: 42})
	b, _ := json.Marshal(ErrorEnvelope{Error: body})
	fmt.Println(string(b))
	// Output:
	// {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"You have exceeded the rate limit of 1000 requests per minute","details":{"limit":1000,"reset_at":"2025-01-01T00:02:00Z","retry_after_seconds":42,"window_seconds":60}}}
}

// FuzzAppendExceeded: the refusal's envelope written directly is what
// json.Marshal writes for Exceeded's.
func FuzzAppendExceeded(f *testing.F) {
	f.Add(int64(100), int64(0), int64(60), int64(1_800_000_000), int64(12), "3f0c6a1e-8d2b")
	f.Add(int64(1), int64(5), int64(1), int64(-5), int64(0), "")
	f.Fuzz(func(t *testing.T, limit, quota, window, reset, retry int64, rid string) {
		l := Limits{Limit: limit, Quota: quota, WindowSeconds: window, ResetAt: reset % (1 << 40), RetryAfter: retry}
		e := Exceeded(&l)
		e.RequestID = rid
		want, err := json.Marshal(ErrorEnvelope{Error: e})
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendExceeded(nil, &l, rid); string(got) != string(want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}
