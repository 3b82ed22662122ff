package wire

import (
	"strconv"
	"strings"

	asciiset "github.com/tollgate-rl/tollgate/shared/ascii"
)

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
	// names are the X-RateLimit fields' names (WithPrefix); nil is the
	// x-ratelimit- prefix.
	names *[5]string
}

// DefaultHeaderPrefix starts the X-RateLimit fields' names.
const DefaultHeaderPrefix = "X-RateLimit-"

var defaultNames = headerNames(DefaultHeaderPrefix)

func headerNames(prefix string) *[5]string {
	p := strings.ToLower(prefix)
	return &[5]string{p + "limit", p + "remaining", p + "reset", p + "window", p + "strategy"}
}

// WithPrefix returns s with its X-RateLimit fields named prefix + "Limit",
// "Remaining", "Reset", "Window" and "Strategy" (lower-case, as HTTP/2 and
// Envoy spell them); the names are built once, not per answer.
func (s HeaderSet) WithPrefix(prefix string) HeaderSet {
	s.names = headerNames(prefix)
	return s
}

// ValidHeaderPrefix reports whether p can start a header name: 1 to 32
// letters, digits and dashes, and not the filter's own x-tollgate- (which
// the filter strips from every client request).
func ValidHeaderPrefix(p string) bool {
	return headerPrefixChars.Match(p, 1, 32) && !strings.HasPrefix(strings.ToLower(p), "x-tollgate")
}

var headerPrefixChars = asciiset.NewSet("A-Za-z0-9-")

// AppendHeaders appends the rate-limit header fields of l, lower-case, to dst.
// now is the Unix second the IETF field's t= counts from; on a denial t= is
// the retry wait instead, so it agrees with Retry-After. A negative remaining
// (a refund race) is reported as 0. The values share one string.
func AppendHeaders(dst [][2]string, l *Limits, set HeaderSet, now int64, denied bool) [][2]string {
	var fs [MaxHeaderFields]HeaderField
	var buf [160]byte
	b, fields := AppendHeaderFields(buf[:0], fs[:0], l, set, now, denied)
	values := string(b)
	for _, f := range fields {
		dst = append(dst, [2]string{f.Name, values[f.Start:f.End]})
	}
	return dst
}

// MaxHeaderFields is the most fields AppendHeaderFields renders.
const MaxHeaderFields = 7

// HeaderField is one field AppendHeaderFields rendered: its lower-case name
// and where its value lies in the buffer.
type HeaderField struct {
	Name       string
	Start, End int
}

// Value is the field's value in buf (the buffer AppendHeaderFields returned).
func (f HeaderField) Value(buf []byte) []byte { return buf[f.Start:f.End] }

// AppendHeaderFields renders the fields AppendHeaders returns, in the same
// order and spelling, as values appended to buf: a caller with a reused
// buffer (the filter, on every admitted request) makes no string per value.
func AppendHeaderFields(buf []byte, fields []HeaderField, l *Limits, set HeaderSet, now int64, denied bool) ([]byte, []HeaderField) {
	remaining := max(l.Remaining, 0)
	names := set.names
	if names == nil {
		names = defaultNames
	}
	field := func(name string, start int) {
		fields = append(fields, HeaderField{Name: name, Start: start, End: len(buf)})
	}
	if set.XRateLimit {
		for i, v := range [...]int64{l.Limit, remaining, l.ResetAt, l.WindowSeconds} {
			start := len(buf)
			buf = strconv.AppendInt(buf, v, 10)
			field(names[i], start)
		}
	}
	if set.Strategy && l.Strategy != "" {
		start := len(buf)
		buf = append(buf, l.Strategy...)
		field(names[4], start)
	}
	if set.IETF {
		t := max(l.ResetAt-now, 0)
		if denied {
			t = l.RetryAfter
		}
		// RateLimit-Policy: "id";q=..;w=.. and RateLimit: "id";r=..;t=..
		for _, f := range [...]struct {
			name   string
			k1, k2 string
			v1, v2 int64
		}{{"ratelimit-policy", ";q=", ";w=", l.SustainedQuota(), l.WindowSeconds}, {"ratelimit", ";r=", ";t=", remaining, t}} {
			start := len(buf)
			buf = strconv.AppendQuote(buf, l.RuleID)
			buf = strconv.AppendInt(append(buf, f.k1...), f.v1, 10)
			buf = strconv.AppendInt(append(buf, f.k2...), f.v2, 10)
			field(f.name, start)
		}
	}
	return buf, fields
}
