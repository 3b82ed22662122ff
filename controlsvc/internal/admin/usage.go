package admin

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// UsageView is an identity's usage in the seed's shape.
type UsageView struct {
	APIKey        string        `json:"api_key,omitempty"` // as the caller named it
	KeyID         string        `json:"key_id,omitempty"`
	Identity      string        `json:"identity"`
	Tier          string        `json:"tier"`
	CurrentWindow CurrentWindow `json:"current_window"`
	Last24Hours   Last24Hours   `json:"last_24_hours"`
}

// CurrentWindow is the tier's window now. Requests are counted per minute,
// so a window shorter than a minute reads the current minute's requests.
type CurrentWindow struct {
	WindowStart  time.Time `json:"window_start"`
	WindowEnd    time.Time `json:"window_end"`
	RequestsMade int64     `json:"requests_made"`
	Limit        int64     `json:"limit"`
	Remaining    int64     `json:"remaining"`
}

// Last24Hours sums the last 24 hourly counters.
type Last24Hours struct {
	TotalRequests int64 `json:"total_requests"`
	Violations    int64 `json:"violations"`
}

// Usage reports what an API key (raw or by key id) or an identity was
// admitted. Requests count what the limiter admitted, leases the filter
// spends included and tokens it gave back excluded.
func (s *Service) Usage(ctx context.Context, who, window string) (UsageView, error) {
	if window != "" && window != "current" {
		return UsageView{}, apierr.Invalid("window", `must be "current"`)
	}
	p := s.live()
	v := UsageView{Tier: p.DefaultTier()}
	switch {
	case apikeys.ValidFormat(who) || strings.HasPrefix(who, "k_") || strings.HasPrefix(who, "key:k_"):
		// A key by its raw value, its id or its identity: its own tier.
		rec, err := s.findKey(ctx, strings.TrimPrefix(who, "key:"))
		if err != nil {
			return UsageView{}, err
		}
		if apikeys.ValidFormat(who) {
			v.APIKey = who
		}
		v.KeyID, v.Tier = rec.ID, s.live().KeyTier(rec.TierID, rec.Tier)
		v.Identity = identity.ID{Kind: identity.KindKey, Value: rec.ID}.String()
	default:
		id, err := identity.Parse(who)
		if err != nil {
			return UsageView{}, apierr.InvalidAt("identity", err)
		}
		v.Identity = id.String()
	}
	t := p.TierByName(v.Tier)
	if t == nil {
		return UsageView{}, apierr.New(apierr.KindNotFound, wire.CodeNotFound, "the caller's tier "+strconv.Quote(v.Tier)+" is not configured")
	}
	now := s.now().UTC()
	w := time.Duration(t.WindowSeconds) * time.Second
	start := now.Truncate(w)
	rep, err := s.usage.Read(ctx, v.Identity, start, now)
	if err != nil {
		s.m.RedisErrors.WithLabelValues("usage").Inc()
		return UsageView{}, apierr.Unavailable("could not read usage", err)
	}
	v.CurrentWindow = CurrentWindow{WindowStart: start, WindowEnd: start.Add(w), RequestsMade: rep.WindowRequests, Limit: t.Limit,
		Remaining: max(t.Limit-rep.WindowRequests, 0)}
	v.Last24Hours = Last24Hours{TotalRequests: rep.DayRequests, Violations: rep.DayViolations}
	return v, nil
}

// AuditPage is a page of the audit trail.
type AuditPage struct {
	Events []audit.Event `json:"events"`
	Count  int           `json:"count"`
	// Next is the since of the next page ("" at the end).
	Next string `json:"next,omitempty"`
}

// MaxAuditPage bounds a page of the trail.
const MaxAuditPage = 1000

// Audit pages the trail, oldest first: since is a stream id from an earlier
// page or an RFC 3339 time.
func (s *Service) Audit(ctx context.Context, typ, since, limit string) (AuditPage, error) {
	q := audit.Query{Type: typ}
	switch typ {
	case "", audit.TypeAdmin, audit.TypeViolation:
	default:
		return AuditPage{}, apierr.Invalid("type", "must be admin or violation")
	}
	var aerr *apierr.Error
	if q.Limit, aerr = pageSize(limit, 100, MaxAuditPage); aerr != nil {
		return AuditPage{}, aerr
	}
	switch {
	case since == "":
	case audit.ValidID(since):
		q.Since = since
	default:
		t, err := time.Parse(time.RFC3339, since)
		if err != nil {
			return AuditPage{}, apierr.Invalid("since", "must be an RFC 3339 time or the next of an earlier page")
		}
		q.Since = strconv.FormatInt(t.UnixMilli(), 10) + "-0"
	}
	evs, next, err := s.trail.List(ctx, q)
	if err != nil {
		s.m.RedisErrors.WithLabelValues("audit").Inc()
		return AuditPage{}, apierr.Unavailable("could not read the audit trail", err)
	}
	if evs == nil {
		evs = []audit.Event{}
	}
	return AuditPage{Events: evs, Count: len(evs), Next: next}, nil
}
