package decision

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/overrides"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Status reads the counters of a caller and endpoint without spending.
func (s *Service) Status(ctx context.Context, req *wire.StatusRequest, trust Trust) (wire.StatusResponse, error) {
	p := s.live.Load()
	t, aerr := p.target(&subject{userID: req.UserID, endpoint: req.Endpoint, method: req.Method, tier: req.Tier, tenant: req.Tenant}, trust)
	if aerr != nil {
		return wire.StatusResponse{}, aerr
	}
	own, aerr := p.ownLimit(req.Strategy, req.Limit, req.WindowSeconds)
	if aerr != nil {
		return wire.StatusResponse{}, aerr
	}
	if t.id.Kind == identity.KindKey && req.Tier == "" {
		// The key's own tier decides its checks; so it does its status.
		rec, err := s.keys.Get(ctx, t.id.Value)
		switch {
		case err == nil && p.KeyTier(rec.TierID, rec.Tier) != "":
			t.tier = p.KeyTier(rec.TierID, rec.Tier)
		case err != nil && !errors.Is(err, apikeys.ErrNotFound):
			s.m.RedisErrors.WithLabelValues("status").Inc()
			return wire.StatusResponse{}, apierr.Unavailable("rate limiter unavailable", err)
		}
	}
	resp := wire.StatusResponse{UserID: req.UserID, Endpoint: t.endpoint, Identity: t.name, Tier: t.tier}
	if p.Exempt(t.id, t.name) {
		resp.RuleID = rules.IDExempt
		return resp, nil
	}
	rs := s.selectRules(p, &t, own)
	for i := range rs {
		a := &rs[i]
		peek := a.req
		peek.Peek = true
		res, err := s.counters.Do(ctx, peek)
		if err != nil {
			s.m.RedisErrors.WithLabelValues("status").Inc()
			return wire.StatusResponse{}, apierr.Unavailable("rate limiter unavailable", err)
		}
		a.res = res
	}
	v, _ := s.verdict(p, &t, rs, 0, 0, -1)
	now := s.now()
	for _, a := range rs {
		r := a.req.Rule
		rst := wire.RuleStatus{RuleID: r.ID, Scope: string(r.Scope), Limit: r.Capacity(), Remaining: a.res.Remaining,
			ResetAt: ceilUnix(now.Add(a.res.ResetAfter)), Strategy: string(r.Algorithm), WindowSeconds: r.WindowSeconds}
		if a.req.Origin > 0 {
			rst.ResetAt = a.req.Origin/1000 + r.WindowSeconds
		}
		resp.Rules = append(resp.Rules, rst)
	}
	resp.RuleID, resp.Limit, resp.Quota, resp.Remaining, resp.ResetAt = v.RuleID, v.Limit, v.Quota, v.Remaining, v.ResetAt
	resp.Strategy, resp.WindowSeconds = v.Strategy, v.WindowSeconds
	if v.Limit > 0 {
		resp.UsagePercentage = float64(v.Limit-min(v.Remaining, v.Limit)) * 100 / float64(v.Limit)
	}
	return resp, nil
}

// Reset deletes a caller's counters for an endpoint: those of the rules that
// would decide its next check and count per caller (never a global or tenant
// counter), with its penalty record.
func (s *Service) Reset(ctx context.Context, req *wire.ResetRequest) (wire.ResetResponse, error) {
	p := s.live.Load()
	t, aerr := p.target(&subject{userID: req.UserID, endpoint: req.Endpoint, method: req.Method, tier: req.Tier, tenant: req.Tenant}, Trusted)
	if aerr != nil {
		return wire.ResetResponse{}, aerr
	}
	var n int64
	for _, lr := range resettable(s.selectRules(p, &t, nil), &t) {
		d, err := s.counters.Reset(ctx, lr)
		n += d
		if err != nil {
			s.m.RedisErrors.WithLabelValues("reset").Inc()
			return wire.ResetResponse{}, apierr.Unavailable("rate limiter unavailable", err)
		}
	}
	s.log.Info("counters reset", "identity", t.name, "endpoint", t.endpoint, "keys", n)
	resp := wire.ResetResponse{UserID: req.UserID, Endpoint: t.endpoint, KeysDeleted: n, ResetAt: s.now().UTC().Format(time.RFC3339)}
	s.audit(ctx, audit.Change(ctx, s.now(), "counters.reset", t.name+" "+t.endpoint, nil, resp))
	return resp, nil
}

// resettable returns the counters a reset deletes: those of the selected
// rules that count per caller (never a global or tenant counter), and the
// counters of limits the caller's checks named themselves, one per
// algorithm (their names leave out the window).
func resettable(rs []applied, t *target) []limiter.Request {
	out := make([]limiter.Request, 0, len(rs)+len(rules.Algorithms))
	for _, a := range rs {
		if !a.req.Rule.Scope.Shared() {
			out = append(out, a.req)
		}
	}
	for _, algo := range rules.Algorithms {
		r := &rules.Rule{ID: rules.IDRequest, Scope: rules.ScopeIdentity, Algorithm: algo, PerEndpoint: true}
		out = append(out, limiter.Request{Owner: limiter.Owner(r, t.id, t.tenant), Rule: r, Endpoint: t.endpoint})
	}
	return out
}

// SetOverride stores a per-caller, per-endpoint quota.
func (s *Service) SetOverride(ctx context.Context, req *wire.ConfigRequest) (wire.ConfigResponse, error) {
	p := s.live.Load()
	t, aerr := p.target(&subject{userID: req.UserID, endpoint: req.Endpoint}, Trusted)
	if aerr != nil {
		return wire.ConfigResponse{}, aerr
	}
	if strings.Contains(t.endpoint, "*") {
		// An override is for one endpoint, matched as written: a pattern
		// would be stored, shown, and never apply.
		return wire.ConfigResponse{}, apierr.Invalid("endpoint", "an override names one endpoint, not a pattern; use a rule for a pattern")
	}
	if aerr := validStrategy(req.Strategy, true); aerr != nil {
		return wire.ConfigResponse{}, aerr
	}
	if _, aerr := p.adhocRule(rules.IDOverride, &req.Limit, &req.WindowSeconds, req.Strategy, req.BurstCapacity); aerr != nil {
		return wire.ConfigResponse{}, aerr
	}
	before, had := s.overrides.Get(t.name, t.endpoint)
	ov := overrides.Override{Limit: req.Limit, WindowSeconds: req.WindowSeconds, Algorithm: rules.Algorithm(req.Strategy), Burst: req.BurstCapacity, UpdatedAt: s.now().UTC().Truncate(time.Second)}
	if err := s.overrides.Set(ctx, t.name, t.endpoint, ov); err != nil {
		s.m.RedisErrors.WithLabelValues("config").Inc()
		return wire.ConfigResponse{}, apierr.Unavailable("could not store the override", err)
	}
	s.log.Info("override set", "identity", t.name, "endpoint", t.endpoint, "limit", req.Limit, "window_seconds", req.WindowSeconds, "strategy", req.Strategy)
	out := *req
	out.Endpoint = t.endpoint
	var was any
	if had {
		was = before
	}
	s.audit(ctx, audit.Change(ctx, s.now(), "override.set", t.name+" "+t.endpoint, was, ov))
	return wire.ConfigResponse{ConfigRequest: out, UpdatedAt: ov.UpdatedAt.Format(time.RFC3339)}, nil
}

// Overrides lists every override.
func (s *Service) Overrides() []overrides.Entry { return s.overrides.All() }

// DeleteOverride removes the override of a caller and endpoint.
func (s *Service) DeleteOverride(ctx context.Context, req *wire.ResetRequest) error {
	p := s.live.Load()
	t, aerr := p.target(&subject{userID: req.UserID, endpoint: req.Endpoint}, Trusted)
	if aerr != nil {
		return aerr
	}
	before, had := s.overrides.Get(t.name, t.endpoint)
	if !had {
		return apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no override for that user_id and endpoint")
	}
	if err := s.overrides.Delete(ctx, t.name, t.endpoint); err != nil {
		s.m.RedisErrors.WithLabelValues("config").Inc()
		return apierr.Unavailable("could not delete the override", err)
	}
	s.log.Info("override deleted", "identity", t.name, "endpoint", t.endpoint)
	s.audit(ctx, audit.Change(ctx, s.now(), "override.delete", t.name+" "+t.endpoint, before, nil))
	return nil
}

// audit appends an admin change to the trail. The change is made: a trail
// that cannot be written is logged, not failed.
func (s *Service) audit(ctx context.Context, ev audit.Event) {
	if err := s.trail.Append(ctx, ev); err != nil {
		s.log.Warn("audit trail not written", "action", ev.Action, "err", err)
	}
}
