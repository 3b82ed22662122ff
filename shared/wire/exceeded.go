package wire

import "strconv"

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
			"reset_at":            string(AppendRFC3339(nil, d.ResetAt)),
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
	dst = AppendRFC3339(dst, d.ResetAt)
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

// The times AppendRFC3339 writes: 0000-01-01T00:00:00Z to
// 9999-12-31T23:59:59Z, the years RFC 3339 has four digits for.
const (
	minRFC3339 = -62167219200
	maxRFC3339 = 253402300799
)

// AppendRFC3339 appends the Unix time unix in UTC as RFC 3339 (what
// time.Time.AppendFormat writes with time.RFC3339 in UTC), a time outside
// the four-digit years as the nearest one inside them. It is written here
// because time's formatter is 30 kB of the filter's module, where this is
// the only time it writes.
func AppendRFC3339(dst []byte, unix int64) []byte {
	unix = min(max(unix, minRFC3339), maxRFC3339)
	// Days and seconds of the day; then the civil date of the day count
	// (the proleptic Gregorian calendar in 400-year eras, counted from
	// 0000-03-01 so that a leap day ends its year).
	days, secs := unix/86400, unix%86400
	if secs < 0 {
		days, secs = days-1, secs+86400
	}
	z := days + 719468 // days since 0000-03-01
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := z - era*146097                                  // day of the era, 0..146096
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // year of the era, 0..399
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // day of the year from March 1
	mp := (5*doy + 2) / 153                                // month from March, 0..11
	day := doy - (153*mp+2)/5 + 1
	month := mp + 3
	if month > 12 {
		month -= 12
	}
	year := yoe + era*400
	if month <= 2 {
		year++
	}
	dst = appendDigits(dst, year, 4)
	dst = appendDigits(append(dst, '-'), month, 2)
	dst = appendDigits(append(dst, '-'), day, 2)
	dst = appendDigits(append(dst, 'T'), secs/3600, 2)
	dst = appendDigits(append(dst, ':'), secs/60%60, 2)
	dst = appendDigits(append(dst, ':'), secs%60, 2)
	return append(dst, 'Z')
}

// appendDigits appends v (0 <= v < 10^width) in width digits.
func appendDigits(dst []byte, v int64, width int) []byte {
	var b [4]byte
	for i := width - 1; i >= 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return append(dst, b[:width]...)
}
