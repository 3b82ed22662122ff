//go:build !wasip1

package wire

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
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

// AppendRFC3339 writes what time's formatter writes, for every time with a
// four-digit year, and the nearest of those for any other.
func TestAppendRFC3339(t *testing.T) {
	for _, c := range []struct {
		unix int64
		want string
	}{
		{0, "1970-01-01T00:00:00Z"},
		{1735689720, "2025-01-01T00:02:00Z"},
		{951782400, "2000-02-29T00:00:00Z"},  // a leap day of a century's leap year
		{4107542399, "2100-02-28T23:59:59Z"}, // 2100 is no leap year
		{-1, "1969-12-31T23:59:59Z"},
		{minRFC3339, "0000-01-01T00:00:00Z"},
		{maxRFC3339, "9999-12-31T23:59:59Z"},
		{minRFC3339 - 1, "0000-01-01T00:00:00Z"},
		{maxRFC3339 + 1, "9999-12-31T23:59:59Z"},
		{-1 << 63, "0000-01-01T00:00:00Z"},
		{1<<63 - 1, "9999-12-31T23:59:59Z"},
	} {
		if got := string(AppendRFC3339([]byte("x"), c.unix)); got != "x"+c.want {
			t.Errorf("AppendRFC3339(%d) = %q, want %q", c.unix, got[1:], c.want)
		}
	}
}

func FuzzAppendRFC3339(f *testing.F) {
	f.Add(int64(0))
	f.Add(int64(minRFC3339))
	f.Add(int64(maxRFC3339))
	f.Add(int64(-86401))
	f.Fuzz(func(t *testing.T, unix int64) {
		in := min(max(unix, minRFC3339), maxRFC3339)
		want := time.Unix(in, 0).UTC().Format(time.RFC3339)
		if got := string(AppendRFC3339(nil, unix)); got != want {
			t.Fatalf("AppendRFC3339(%d) = %q, want %q", unix, got, want)
		}
	})
}
