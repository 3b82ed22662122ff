package wire

import (
	"strconv"
	"time"
)

// Exceeded is the RATE_LIMIT_EXCEEDED body of a request refused by a rate
// limit, built from a denial's limits; it states the sustained quota. The
// filter sends it to clients; the control service adds it to its own 429
// answers, so both say the same thing.
func Exceeded(d *Limits) ErrorBody {
	q := d.SustainedQuota()
	return ErrorBody{
		Code:    CodeRateLimitExceeded,
		Message: "You have exceeded the rate limit of " + strconv.FormatInt(q, 10) + requests(q) + " per " + windowText(d.WindowSeconds),
		Details: map[string]any{
			"limit":               q,
			"window_seconds":      d.WindowSeconds,
			"reset_at":            time.Unix(d.ResetAt, 0).UTC().Format(time.RFC3339),
			"retry_after_seconds": d.RetryAfter,
		},
	}
}

func requests(n int64) string {
	if n == 1 {
		return " request"
	}
	return " requests"
}

func windowText(s int64) string {
	switch s {
	case 1:
		return "second"
	case 60:
		return "minute"
	case 3600:
		return "hour"
	}
	return strconv.FormatInt(s, 10) + " seconds"
}
