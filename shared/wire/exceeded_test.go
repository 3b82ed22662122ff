package wire

import (
	"encoding/json"
	"fmt"
)

func ExampleExceeded() {
	body := Exceeded(&Limits{Limit: 1000, WindowSeconds: 60, ResetAt: 1735689720, RetryAfter: 42})
	b, _ := json.Marshal(ErrorEnvelope{Error: body})
	fmt.Println(string(b))
	// Output:
	// {"error":{"code":"RATE_LIMIT_EXCEEDED","message":"You have exceeded the rate limit of 1000 requests per minute","details":{"limit":1000,"reset_at":"2025-01-01T00:02:00Z","retry_after_seconds":42,"window_seconds":60}}}
}
