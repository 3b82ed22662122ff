package wire

import "strconv"

// Limits is where the rule that decided a request stands: what the 429 body
// and the rate-limit header fields report, on the filter and the service alike.
type Limits struct {
	RuleID   string
	Strategy string
	// Limit is the most the counter admits at once (what Remaining counts
	// down from); Quota the sustained rate per WindowSeconds (0: Limit).
	Limit         int64
	Quota         int64
	Remaining     int64
	ResetAt       int64 // Unix seconds
	WindowSeconds int64
	RetryAfter    int64 // seconds; set on a denial
}

// Limits returns the decision's limits.
func (d *CheckResponse) Limits() Limits {
	return Limits{RuleID: d.RuleID, Strategy: d.Strategy, Limit: d.Limit, Quota: d.Quota, Remaining: d.Remaining,
		ResetAt: d.ResetAt, WindowSeconds: d.WindowSeconds, RetryAfter: d.RetryAfter}
}

// SustainedQuota is the requests per window: Quota, or Limit without one.
func (l *Limits) SustainedQuota() int64 {
	if l.Quota > 0 {
		return l.Quota
	}
	return l.Limit
}

// HeaderSet chooses the rate-limit header fields written.
type HeaderSet struct {
	// XRateLimit: x-ratelimit-limit, -remaining, -reset and -window.
	XRateLimit bool
	// Strategy: x-ratelimit-strategy (the algorithm of the deciding rule).
	Strategy bool
	// IETF: the httpapi draft's ratelimit-policy and ratelimit fields.
	IETF bool
}

// AppendHeaders appends the rate-limit header fields of l, lower-case, to dst.
// now is the Unix second the IETF field's t= counts from; on a denial t= is
// the retry wait instead, so it agrees with Retry-After. A negative remaining
// (a refund race) is reported as 0.
func AppendHeaders(dst [][2]string, l *Limits, set HeaderSet, now int64, denied bool) [][2]string {
	remaining := strconv.FormatInt(max(l.Remaining, 0), 10)
	if set.XRateLimit {
		dst = append(dst,
			[2]string{"x-ratelimit-limit", strconv.FormatInt(l.Limit, 10)},
			[2]string{"x-ratelimit-remaining", remaining},
			[2]string{"x-ratelimit-reset", strconv.FormatInt(l.ResetAt, 10)},
			[2]string{"x-ratelimit-window", strconv.FormatInt(l.WindowSeconds, 10)})
	}
	if set.Strategy && l.Strategy != "" {
		dst = append(dst, [2]string{"x-ratelimit-strategy", l.Strategy})
	}
	if set.IETF {
		name := strconv.Quote(l.RuleID)
		t := max(l.ResetAt-now, 0)
		if denied {
			t = l.RetryAfter
		}
		dst = append(dst,
			[2]string{"ratelimit-policy", name + ";q=" + strconv.FormatInt(l.SustainedQuota(), 10) + ";w=" + strconv.FormatInt(l.WindowSeconds, 10)},
			[2]string{"ratelimit", name + ";r=" + remaining + ";t=" + strconv.FormatInt(t, 10)})
	}
	return dst
}
