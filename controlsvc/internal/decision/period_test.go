package decision

import (
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// A calendar period starts at the zone's midnight, whatever UTC's date, and
// lasts what the calendar says: 23 and 25 hours across daylight saving, 29
// days in a leap February.
func TestPeriodBounds(t *testing.T) {
	zone := func(name string) *time.Location {
		z, err := policy.Zone(name)
		if err != nil {
			t.Fatal(err)
		}
		return z
	}
	for _, tc := range []struct {
		period     rules.Period
		zone       string
		now        string // RFC 3339
		start, end string
		hours      float64
	}{
		{rules.PeriodDay, "", "2026-11-25T23:30:00Z", "2026-11-25T00:00:00Z", "2026-11-26T00:00:00Z", 24},
		{rules.PeriodDay, "Asia/Tokyo", "2026-11-25T23:30:00Z", "2026-11-26T00:00:00+09:00", "2026-11-27T00:00:00+09:00", 24},
		{rules.PeriodDay, "America/New_York", "2026-03-08T12:00:00-04:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00", 23},
		{rules.PeriodDay, "America/New_York", "2026-11-01T12:00:00-05:00", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00", 25},
		{rules.PeriodMonth, "Europe/Paris", "2028-02-29T23:59:59+01:00", "2028-02-01T00:00:00+01:00", "2028-03-01T00:00:00+01:00", 29 * 24},
		{rules.PeriodMonth, "", "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", 31 * 24},
	} {
		now, _ := time.Parse(time.RFC3339, tc.now)
		start, end := PeriodBounds(tc.period, zone(tc.zone), now)
		ws, _ := time.Parse(time.RFC3339, tc.start)
		we, _ := time.Parse(time.RFC3339, tc.end)
		if !start.Equal(ws) || !end.Equal(we) || end.Sub(start).Hours() != tc.hours {
			t.Errorf("%s in %q at %s: [%s, %s), want [%s, %s) of %v h", tc.period, tc.zone, tc.now, start, end, ws, we, tc.hours)
		}
	}
	r := &rules.Rule{ID: "daily", Scope: rules.ScopeIdentity, Algorithm: rules.FixedWindow, Limit: 5, Period: rules.PeriodDay, TimeZone: "Asia/Tokyo"}
	now, _ := time.Parse(time.RFC3339, "2026-11-25T23:30:00Z")
	c, origin := inPeriod(r, now)
	if c == r || c.WindowSeconds != 86400 || origin != time.Date(2026, 11, 26, 0, 0, 0, 0, zone("Asia/Tokyo")).UnixMilli() || r.WindowSeconds != 0 {
		t.Fatalf("in period: %+v, origin %d", c, origin)
	}
	if plain := (&rules.Rule{WindowSeconds: 60}); func() bool { c, o := inPeriod(plain, now); return c != plain || o != 0 }() {
		t.Fatal("a rule without a period was changed")
	}
}
