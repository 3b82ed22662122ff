package decision

import (
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// PeriodBounds is the calendar period of p holding now, in loc: a day from
// its midnight, a month from its first midnight (a day is 23 or 25 hours
// across a daylight-saving change).
func PeriodBounds(p rules.Period, loc *time.Location, now time.Time) (start, end time.Time) {
	t := now.In(loc)
	switch p {
	case rules.PeriodMonth:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, loc)
		return start, start.AddDate(0, 1, 0)
	default:
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, loc)
		return start, start.AddDate(0, 0, 1)
	}
}

// inPeriod is r as counted now: a rule with a calendar period becomes a
// fixed window of the current period's length, starting at its start
// (origin, Unix ms). Other rules are r itself.
func inPeriod(r *rules.Rule, now time.Time) (*rules.Rule, int64) {
	if r.Period == "" {
		return r, 0
	}
	loc, err := policy.Zone(r.TimeZone)
	if err != nil {
		loc = time.UTC // the policy refused unknown zones; never reached
	}
	start, end := PeriodBounds(r.Period, loc, now)
	c := *r
	c.WindowSeconds = int64(end.Sub(start) / time.Second)
	return &c, start.UnixMilli()
}
