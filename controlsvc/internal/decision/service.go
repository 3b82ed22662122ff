package decision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/shared/breaker"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Rule ids that do not come from the configuration.
const (
	RuleExempt   = "exempt"
	RuleOverride = "override" // PUT /v1/rate-limit/config
	RuleRequest  = "request"  // limit given in the check itself
)

// Input bounds.
const (
	MaxEndpointLen = 2048
	MaxCost        = 1_000_000
	MaxReturned    = 1_000_000_000
)

// Service decides. It is safe for concurrent use.
type Service struct {
	rdb       redis.UniversalClient
	lim       *limiter.Limiter
	keys      *apikeys.Store
	overrides *Overrides
	m         *metrics.Metrics
	log       *slog.Logger
	now       func() time.Time
	policy    atomic.Pointer[Policy]
	breaker   *breaker.Breaker
}

// BreakerOpen reports whether Redis calls are being skipped.
func (s *Service) BreakerOpen() bool { return s.breaker.Open() }

// ErrBreakerOpen is the cause of failures answered without asking Redis.
var ErrBreakerOpen = errors.New("redis circuit breaker is open")

// Deps are the service's collaborators.
type Deps struct {
	Redis     redis.UniversalClient
	Limiter   *limiter.Limiter
	Keys      *apikeys.Store
	Overrides *Overrides
	Metrics   *metrics.Metrics
	Log       *slog.Logger
	Now       func() time.Time
	// BreakerThreshold consecutive Redis failures open the circuit breaker
	// for BreakerCooldown.
	BreakerThreshold int
	BreakerCooldown  time.Duration
}

// New returns a service deciding with policy p.
func New(d Deps, p *Policy) *Service {
	s := &Service{rdb: d.Redis, lim: d.Limiter, keys: d.Keys, overrides: d.Overrides, m: d.Metrics, log: d.Log, now: d.Now,
		breaker: breaker.New(d.BreakerThreshold, d.BreakerCooldown)}
	s.policy.Store(p)
	return s
}

// SetPolicy swaps in a new policy (config reload).
func (s *Service) SetPolicy(p *Policy) { s.policy.Store(p) }

// Policy returns the live policy.
func (s *Service) Policy() *Policy { return s.policy.Load() }

// caller is a validated check request.
type caller struct {
	id       identity.ID
	tier     string
	tenant   string
	endpoint string
	method   string
	cost     int64
	lease    int64
	returned int64
	adhoc    *rules.Rule // the check's own limit, if it gave one
}

var methodRE = regexp.MustCompile(`^[A-Z]{1,16}$`)

// Trust is what a caller of the decision API proved.
type Trust bool

const (
	// Untrusted callers (no service credential) may use the seed's plain
	// check shape only.
	Untrusted Trust = false
	// Trusted callers hold a decision token (the filter): they may name
	// tiers, tenants, costs, leases, refunds and key identities. Admin
	// routes (reset, overrides) act as trusted behind the admin token.
	Trusted Trust = true
)

// validate checks everything the request says before anything touches Redis.
func (p *Policy) validate(req *wire.CheckRequest, trust Trust) (*caller, *apierr.Error) {
	c := &caller{method: req.Method}
	if req.UserID == "" {
		return nil, apierr.Invalid("user_id", "is required")
	}
	id, err := identity.Parse(req.UserID)
	if err != nil {
		return nil, apierr.Invalid("user_id", strings.TrimPrefix(err.Error(), identity.ErrInvalid.Error()+": "))
	}
	c.id = id
	if trust == Untrusted {
		// What a caller without the credential could buy with these: another
		// tier's quota, another tenant's, an API key's identity without the
		// key, tokens credited to a shared bucket, a costly script run.
		switch {
		case req.Tier != "":
			return nil, apierr.Forbidden("tier")
		case req.Tenant != "":
			return nil, apierr.Forbidden("tenant")
		case req.Cost > 1:
			return nil, apierr.Forbidden("cost")
		case req.Lease != 0:
			return nil, apierr.Forbidden("lease")
		case req.Returned != 0:
			return nil, apierr.Forbidden("returned")
		case id.Kind == identity.KindKey:
			return nil, apierr.ForbiddenBecause("user_id", "an API-key identity needs the service credential; present the key itself as api_key")
		}
	}
	ep, aerr := validEndpoint(req.Endpoint)
	if aerr != nil {
		return nil, aerr
	}
	c.endpoint = ep
	if req.Method != "" && !methodRE.MatchString(req.Method) {
		return nil, apierr.Invalid("method", "must be an upper-case HTTP method")
	}
	if req.Tier != "" && !rules.ValidTierName(req.Tier) {
		return nil, apierr.Invalid("tier", "must match ^[a-z0-9_]+$")
	}
	c.tier = p.tier(req.Tier)
	if req.Tenant != "" {
		if _, err := identity.User(req.Tenant); err != nil {
			return nil, apierr.Invalid("tenant", "must be 1..255 printable characters")
		}
		c.tenant = req.Tenant
	}
	switch {
	case req.Cost < 0 || req.Cost > MaxCost:
		return nil, apierr.Invalid("cost", fmt.Sprintf("must be in 0..%d", MaxCost))
	case req.Lease < 0:
		return nil, apierr.Invalid("lease", "must be >= 0")
	case req.Returned < 0 || req.Returned > MaxReturned:
		return nil, apierr.Invalid("returned", fmt.Sprintf("must be in 0..%d", MaxReturned))
	}
	c.cost = max(req.Cost, 1)
	c.lease = min(req.Lease, p.Config.Lease.Max)
	if p.Config.Lease.Fraction == 0 {
		c.lease = 0
	}
	c.returned = req.Returned
	if req.Strategy != "" && !rules.ValidAlgorithm(rules.Algorithm(req.Strategy)) {
		e := apierr.Invalid("strategy", fmt.Sprintf("%q is not one of %v", req.Strategy, rules.Algorithms))
		e.Code = wire.CodeInvalidStrategy
		return nil, e
	}
	if req.Limit != nil || req.WindowSeconds != nil {
		r, aerr := p.adhocRule(RuleRequest, req.Limit, req.WindowSeconds, req.Strategy, 0)
		if aerr != nil {
			return nil, aerr
		}
		if c.cost > r.Capacity() {
			return nil, apierr.Invalid("cost", "is larger than the limit")
		}
		c.adhoc = r
	}
	return c, nil
}

// adhocRule builds the identity-scoped, per-endpoint rule of a limit given in
// a request (check or override). The limit is bounded by max_adhoc_limit, so
// no caller sizes a counter (or a sliding log) at will.
func (p *Policy) adhocRule(id string, limit, window *int64, strategy string, burst int64) (*rules.Rule, *apierr.Error) {
	if limit == nil {
		return nil, apierr.InvalidLimit("limit", "is required with window_seconds")
	}
	if *limit <= 0 || *limit > p.Config.MaxAdhocLimit {
		return nil, apierr.InvalidLimit("limit", fmt.Sprintf("must be in 1..%d", p.Config.MaxAdhocLimit))
	}
	if burst > p.Config.MaxAdhocLimit {
		return nil, apierr.InvalidLimit("burst_capacity", fmt.Sprintf("must be in 0..%d", p.Config.MaxAdhocLimit))
	}
	w := int64(60)
	if window != nil {
		w = *window
	}
	if w < rules.MinWindowSeconds || w > rules.MaxWindowSeconds {
		return nil, apierr.InvalidLimit("window_seconds", fmt.Sprintf("must be in %d..%d", rules.MinWindowSeconds, rules.MaxWindowSeconds))
	}
	if burst < 0 {
		return nil, apierr.InvalidLimit("burst_capacity", "must be >= 0")
	}
	algo := rules.Algorithm(strategy)
	if algo == "" {
		algo = p.Config.DefaultAlgorithm
	}
	return &rules.Rule{ID: id, Scope: rules.ScopeIdentity, Algorithm: algo, Limit: *limit, WindowSeconds: w, Burst: burst, PerEndpoint: true}, nil
}

// validEndpoint normalises the endpoint (shared/paths, as the filter does):
// one resource is one counter however it is spelled.
func validEndpoint(ep string) (string, *apierr.Error) {
	if ep == "" {
		return "", apierr.Invalid("endpoint", "is required")
	}
	n, err := paths.Normalize(ep)
	if err != nil {
		return "", apierr.Invalid("endpoint", strings.TrimPrefix(err.Error(), paths.ErrInvalid.Error()+": "))
	}
	if len(n) > MaxEndpointLen {
		return "", apierr.Invalid("endpoint", fmt.Sprintf("is longer than %d bytes", MaxEndpointLen))
	}
	return n, nil
}

// resolveKey checks an API key and makes it the caller's identity (unless a
// verified JWT subject came first) and tier (unless the JWT gave one).
func (s *Service) resolveKey(ctx context.Context, p *Policy, c *caller, raw, reqTier string) error {
	if !apikeys.ValidFormat(raw) {
		return &apierr.Error{Status: http.StatusBadRequest, Code: wire.CodeInvalidAPIKey,
			Message: "The provided API key format is invalid. Expected format: tg_<43 characters>"}
	}
	var rec apikeys.Record
	found := true
	err := s.guarded(ctx, "api_key", func() error {
		var err error
		rec, err = s.keys.Lookup(ctx, raw)
		if errors.Is(err, apikeys.ErrNotFound) {
			found = false // an answer about the key, not a failure of Redis
			return nil
		}
		return err
	})
	if err != nil {
		return err // Redis: the failure mode decides
	}
	if !found {
		return &apierr.Error{Status: http.StatusUnauthorized, Code: wire.CodeInvalidAPIKey, Message: "The provided API key is not recognised"}
	}
	if rec.Status == apikeys.StatusRevoked {
		return &apierr.Error{Status: http.StatusForbidden, Code: wire.CodeAPIKeyRevoked,
			Message: "This API key has been revoked and can no longer be used",
			Details: map[string]any{"revoked_at": rec.RevokedAt.Format(time.RFC3339)}}
	}
	if rec.Expired(s.now()) {
		return &apierr.Error{Status: http.StatusForbidden, Code: wire.CodeAPIKeyExpired,
			Message: "This API key has expired", Details: map[string]any{"expired_at": rec.ExpiresAt.Format(time.RFC3339)}}
	}
	if c.id.Kind != identity.KindUser {
		c.id = identity.ID{Kind: identity.KindKey, Value: rec.ID}
	}
	if reqTier == "" && rec.Tier != "" {
		c.tier = p.tier(rec.Tier)
	}
	return nil
}

// applied is one rule's outcome for one check.
type applied struct {
	rule  *rules.Rule
	owner keys.Owner
	key   string
	res   limiter.Result
}

// selectRules returns the rules of a caller, with their counters.
func (s *Service) selectRules(p *Policy, c *caller) []applied {
	var matched []*rules.Rule
	switch {
	case c.adhoc != nil:
		matched = []*rules.Rule{c.adhoc}
	default:
		if ov, ok := s.overrides.Get(c.id.String(), c.endpoint); ok {
			r, _ := p.adhocRule(RuleOverride, &ov.Limit, &ov.WindowSeconds, string(ov.Algorithm), ov.Burst)
			if r != nil {
				matched = []*rules.Rule{r}
				break
			}
		}
		var buf [6]*rules.Rule
		matched = p.match(buf[:0], rules.Request{Tier: c.tier, Method: c.method, Path: c.endpoint, IdentityKind: string(c.id.Kind), Tenant: c.tenant})
	}
	out := make([]applied, len(matched))
	for i, r := range matched {
		owner := keys.NewOwner(string(r.Scope), rules.Subject(r.Scope, c.id.String(), c.id.Value, c.tenant))
		ep := ""
		if r.PerEndpoint {
			ep = c.endpoint
		}
		out[i] = applied{rule: r, owner: owner, key: keys.Counter(owner, r.ID, ep, string(r.Algorithm), r.WindowSeconds)}
	}
	return out
}

// Check decides one request. Errors are *apierr.Error.
func (s *Service) Check(ctx context.Context, req *wire.CheckRequest, trust Trust) (wire.CheckResponse, error) {
	start := time.Now()
	defer func() { s.m.CheckDuration.Observe(time.Since(start).Seconds()) }()
	p := s.policy.Load()
	c, aerr := p.validate(req, trust)
	if aerr != nil {
		return wire.CheckResponse{}, aerr
	}
	if req.APIKey != "" {
		if err := s.resolveKey(ctx, p, c, req.APIKey, req.Tier); err != nil {
			var ae *apierr.Error
			if errors.As(err, &ae) {
				return wire.CheckResponse{}, ae
			}
			return s.failure(p, c, nil, fmt.Errorf("look up api key: %w", err))
		}
	}
	if p.exempt(c.id) {
		s.m.Decisions.WithLabelValues(metrics.Exempt, c.tier, RuleExempt).Inc()
		return wire.CheckResponse{Allowed: true, RuleID: RuleExempt, Identity: c.id.String(), Tier: c.tier,
			Lease: wire.Lease{Granted: c.lease, TTLMillis: p.Config.Lease.TTLMS}}, nil
	}
	rs := s.selectRules(p, c)
	if len(rs) == 0 {
		// Unreachable with a valid config (every tier has a default rule),
		// but an empty answer must still be a decision.
		return wire.CheckResponse{Allowed: true, Identity: c.id.String(), Tier: c.tier}, nil
	}
	for i := range rs {
		// Refuse before anything is spent: a rejected request touches nothing.
		if cost := c.cost * rs[i].rule.EffectiveCost(); cost > rs[i].rule.Capacity() {
			return wire.CheckResponse{}, apierr.Invalid("cost", fmt.Sprintf("%d is more than rule %s can ever allow (%d)", cost, rs[i].rule.ID, rs[i].rule.Capacity()))
		}
	}
	single := len(rs) == 1
	for i := range rs {
		a := &rs[i]
		lr := limiter.Request{
			Owner: a.owner, Key: a.key,
			Quota: limiter.Quota{Algorithm: a.rule.Algorithm, Limit: a.rule.Limit, WindowSeconds: a.rule.WindowSeconds, Capacity: a.rule.Capacity()},
			Cost:  c.cost * a.rule.EffectiveCost(), LeaseFraction: p.Config.Lease.Fraction,
		}
		// A lease belongs to one bucket: with several rules, no lease.
		if single {
			lr.Lease, lr.Returned = c.lease, c.returned
		}
		if a.rule.Scope != rules.ScopeGlobal && a.rule.Scope != rules.ScopeTenant {
			lr.Penalty = p.penalty
		}
		res, err := s.limit(ctx, lr)
		if err != nil {
			return s.failure(p, c, a.rule, err)
		}
		a.res = res
	}
	resp, result := s.verdict(p, c, rs)
	s.m.Decisions.WithLabelValues(result, c.tier, resp.RuleID).Inc()
	s.m.LeaseGranted.Add(float64(resp.Lease.Granted))
	for i := range rs {
		if rs[i].res.Penalized {
			s.m.Penalties.Inc()
			break
		}
	}
	return resp, nil
}

// limit runs one counter through the circuit breaker.
func (s *Service) limit(ctx context.Context, lr limiter.Request) (res limiter.Result, err error) {
	err = s.guarded(ctx, "check", func() error {
		res, err = s.lim.Do(ctx, lr)
		return err
	})
	return res, err
}

// guarded runs one Redis call of the decision path through the circuit
// breaker: while it is open the call is not made and ErrBreakerOpen is
// returned, so a dead Redis costs a check nothing.
func (s *Service) guarded(ctx context.Context, op string, call func() error) error {
	if !s.breaker.Allow(s.now()) {
		return ErrBreakerOpen
	}
	err := call()
	// A caller that went away says nothing about Redis; nor does a request
	// the limiter refused.
	if err != nil && (ctx.Err() != nil || errors.Is(err, limiter.ErrBadRequest)) {
		return err
	}
	if s.breaker.Record(err == nil, s.now()) {
		if err != nil {
			s.log.Error("redis failing; circuit breaker open, answering by the failure mode", "mode", s.policy.Load().Config.FailureMode, "err", err)
		} else {
			s.log.Info("redis answering again; circuit breaker closed")
		}
	}
	if err != nil {
		s.m.RedisErrors.WithLabelValues(op).Inc()
	}
	return err
}

// verdict folds the rules' outcomes: denied if any rejecting rule denied; the
// rule reported is the denial with the longest wait, or else the one with the
// least left. It also names the result for the decisions metric.
func (s *Service) verdict(p *Policy, c *caller, rs []applied) (wire.CheckResponse, string) {
	var decider *applied
	denied, logOnly := false, false
	for i := range rs {
		a := &rs[i]
		if a.res.Allowed {
			continue
		}
		if a.rule.Action == rules.ActionLogOnly {
			logOnly = true
			continue
		}
		if !denied || a.res.RetryAfter > decider.res.RetryAfter {
			decider = a
		}
		denied = true
	}
	if !denied {
		for i := range rs {
			a := &rs[i]
			if decider == nil || a.res.Remaining*decider.rule.Limit < decider.res.Remaining*a.rule.Limit {
				decider = a
			}
		}
	}
	now := s.now()
	resp := wire.CheckResponse{
		Allowed:       !denied,
		Limit:         decider.rule.Limit,
		Remaining:     decider.res.Remaining,
		ResetAt:       ceilUnix(now.Add(decider.res.ResetAfter)),
		Strategy:      string(decider.rule.Algorithm),
		WindowSeconds: decider.rule.WindowSeconds,
		RuleID:        decider.rule.ID,
		Identity:      c.id.String(),
		Tier:          c.tier,
		LogOnly:       logOnly,
	}
	result := metrics.Allowed
	switch {
	case denied:
		result = metrics.Denied
		resp.RetryAfter = max(1, ceilSeconds(decider.res.RetryAfter))
	case logOnly:
		result = metrics.LogOnly
	}
	if len(rs) == 1 && rs[0].res.Granted > 0 {
		ttl := time.Duration(p.Config.Lease.TTLMS) * time.Millisecond
		if a := rs[0]; a.rule.Algorithm != rules.TokenBucket && a.rule.Algorithm != rules.GCRA {
			// Tokens of a window must not be spent in the next one.
			ttl = min(ttl, a.res.ResetAfter)
		}
		resp.Lease = wire.Lease{Granted: rs[0].res.Granted, TTLMillis: ttl.Milliseconds()}
	}
	return resp, result
}

// failure applies the failure mode to a Redis error.
func (s *Service) failure(p *Policy, c *caller, r *rules.Rule, err error) (wire.CheckResponse, error) {
	if errors.Is(err, limiter.ErrBadRequest) {
		return wire.CheckResponse{}, &apierr.Error{Status: http.StatusInternalServerError, Code: wire.CodeInternal, Message: "internal error", Err: err}
	}
	if !errors.Is(err, ErrBreakerOpen) {
		s.log.Warn("redis unavailable for a check", "mode", p.Config.FailureMode, "err", err)
	}
	if p.Config.FailureMode == config.FailClosed {
		return wire.CheckResponse{}, apierr.Unavailable("rate limiter unavailable", err)
	}
	s.m.Decisions.WithLabelValues(metrics.Degraded, c.tier, "").Inc()
	resp := wire.CheckResponse{Allowed: true, Degraded: true, Identity: c.id.String(), Tier: c.tier}
	if r != nil {
		resp.Limit, resp.Strategy, resp.WindowSeconds, resp.RuleID = r.Limit, string(r.Algorithm), r.WindowSeconds, r.ID
	}
	return resp, nil
}

func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

func ceilUnix(t time.Time) int64 {
	u := t.Unix()
	if t.Nanosecond() > 0 {
		u++
	}
	return u
}
