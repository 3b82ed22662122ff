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

// AppendExceeded appends the envelope of Exceeded(d) with requestID, byte
// for byte what json.Marshal writes for it, without building its details
// map: the filter writes one per refused request.
func AppendExceeded(dst []byte, d *Limits, requestID string) []byte {
	q := d.SustainedQuota()
	dst = append(dst, `{"error":{"code":"`+CodeRateLimitExceeded+`","message":"You have exceeded the rate limit of `...)
	dst = strconv.AppendInt(dst, q, 10)
	dst = append(dst, requests(q)...)
	dst = append(dst, " per "...)
	dst = append(dst, windowText(d.WindowSeconds)...)
	dst = append(dst, `","details":{"limit":`...)
	dst = strconv.AppendInt(dst, q, 10)
	dst = append(dst, `,"reset_at":"`...)
	dst = time.Unix(d.ResetAt, 0).UTC().AppendFormat(dst, time.RFC3339)
	dst = append(dst, `","retry_after_seconds":`...)
	dst = strconv.AppendInt(dst, d.RetryAfter, 10)
	dst = append(dst, `,"window_seconds":`...)
	dst = strconv.AppendInt(dst, d.WindowSeconds, 10)
	dst = append(dst, '}')
	dst = appendOptString(dst, `,"request_id":`, requestID)
	return append(dst, "}}"...)
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
