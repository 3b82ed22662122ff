package decision

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/overrides"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/summary"
	"github.com/tollgate-rl/tollgate/shared/breaker"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// maxTrailField bounds what a violation event keeps of a client-chosen
// string.
const maxTrailField = 256

// clip cuts s to n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Input bounds.
const (
	MaxCost     = 1_000_000
	MaxReturned = 1_000_000_000
)

// Counters runs rules' counters (the limiter).
type Counters interface {
	Do(ctx context.Context, r limiter.Request) (limiter.Result, error)
	Reset(ctx context.Context, r limiter.Request) (int64, error)
	Ping(ctx context.Context) error
}

// KeyStore finds API key records, by raw key or by key id.
type KeyStore interface {
	Lookup(ctx context.Context, raw string) (apikeys.Record, error)
	Get(ctx context.Context, id string) (apikeys.Record, error)
}

// OverrideStore holds per-identity, per-endpoint quotas. Get must not wait
// on Redis: it is on every check's path.
type OverrideStore interface {
	Get(identity, endpoint string) (overrides.Override, bool)
	Set(ctx context.Context, identity, endpoint string, ov overrides.Override) error
	Delete(ctx context.Context, identity, endpoint string) error
	All() []overrides.Entry
}

// UsageRecorder counts what identities were admitted; it must not wait on
// Redis.
type UsageRecorder interface {
	Record(identity string, at time.Time, requests int64, violation *audit.Event)
}

// Trail appends to the audit trail.
type Trail interface {
	Append(ctx context.Context, evs ...audit.Event) error
}

// ReplayStore keeps the answers of batches under their idempotency key.
type ReplayStore interface {
	Claim(ctx context.Context, idemKey, digest string) (*wire.BatchCheckResponse, error)
	Save(ctx context.Context, idemKey, digest string, answer *wire.BatchCheckResponse) error
}

// Service decides. It orchestrates the policy, the stores and the counters;
// it speaks no Redis itself. It is safe for concurrent use.
type Service struct {
	counters  Counters
	keys      KeyStore
	overrides OverrideStore
	replays   ReplayStore
	usage     UsageRecorder
	trail     Trail
	m         *metrics.Metrics
	log       *slog.Logger
	now       func() time.Time
	sleep     func(ctx context.Context, d time.Duration) bool
	live      atomic.Pointer[view]
	breaker   *breaker.Breaker
	local     LocalCounters // nil: no local counting while Redis is away
	rand      func() float64
	summary   SummaryRecorder // nil: no summary kept
}

// SummaryRecorder gathers the deployment's summary (store/summary); it
// must not wait on Redis.
type SummaryRecorder interface {
	Observe(o summary.Observation)
	RedisError(at time.Time)
}

// BreakerOpen reports whether Redis calls are being skipped.
func (s *Service) BreakerOpen() bool { return s.breaker.Open() }

// ErrBreakerOpen is the cause of failures answered without asking Redis.
var ErrBreakerOpen = errors.New("redis circuit breaker is open")

// ErrKeyUnverifiable is wrapped by the refusal of a request that needs an
// API key while Redis cannot be asked about the one it carries (fail_open):
// the rate limit service answers it OVER_LIMIT, not an error Envoy may let
// through.
var ErrKeyUnverifiable = errors.New("the api key cannot be verified while redis is unavailable")

// Deps are the service's collaborators.
type Deps struct {
	Counters  Counters
	Keys      KeyStore
	Overrides OverrideStore
	Replays   ReplayStore
	Usage     UsageRecorder
	Trail     Trail
	Metrics   *metrics.Metrics
	Log       *slog.Logger
	Now       func() time.Time
	// Sleep waits d or until ctx ends, reporting whether it waited it all
	// (a throttled request); nil is the real clock.
	Sleep func(ctx context.Context, d time.Duration) bool
	// BreakerThreshold consecutive Redis failures open the circuit breaker
	// for BreakerCooldown.
	BreakerThreshold int
	BreakerCooldown  time.Duration
	// Local counts while Redis cannot be reached and the failure mode is
	// fail_open (memlimit); nil lets such requests pass uncounted.
	Local LocalCounters
	// Rand returns a number in [0, 1) for Retry-After's jitter; nil is
	// math/rand/v2's.
	Rand func() float64
	// Summary gathers the operator's summary; nil keeps none.
	Summary SummaryRecorder
}

// LocalCounters decide a counter's request in this process only.
type LocalCounters interface {
	Do(r limiter.Request) limiter.Result
}

// New returns a service deciding with policy p and settings set.
func New(d Deps, p *policy.Policy, set Settings) *Service {
	s := &Service{counters: d.Counters, keys: d.Keys, overrides: d.Overrides, replays: d.Replays, usage: d.Usage, trail: d.Trail, m: d.Metrics, log: d.Log, now: d.Now,
		breaker: breaker.New(d.BreakerThreshold, int64(d.BreakerCooldown)), sleep: d.Sleep, local: d.Local, rand: d.Rand, summary: d.Summary}
	if s.sleep == nil {
		s.sleep = sleepCtx
	}
	if s.rand == nil {
		s.rand = rand.Float64
	}
	s.SetPolicy(p, set)
	return s
}

// SetPolicy swaps in a new policy and the settings in force with it (a
// config reload, a runtime change).
func (s *Service) SetPolicy(p *policy.Policy, set Settings) {
	s.live.Store(&view{Policy: p, Settings: set})
}

// Policy returns the live policy.
func (s *Service) Policy() *policy.Policy { return s.live.Load().Policy }

// Ping reports whether Redis answers (health checks).
func (s *Service) Ping(ctx context.Context) error { return s.counters.Ping(ctx) }

// resolveKey checks an API key and makes it the caller's identity and tier
// (unless the JWT gave one).
func (s *Service) resolveKey(ctx context.Context, p *view, c *caller, raw, reqTier string, charging bool) error {
	if !apikeys.ValidFormat(raw) {
		e := apierr.New(apierr.KindInvalid, wire.CodeInvalidAPIKey, "The provided API key format is invalid. Expected format: "+apikeys.Format)
		e.Details = map[string]any{"provided_key": maskKey(raw)}
		return e
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
		e := apierr.New(apierr.KindUnauthorized, wire.CodeInvalidAPIKey, "The provided API key is not recognised")
		e.Details = map[string]any{"provided_key": maskKey(raw)}
		return e
	}
	// A charge is the cost of a response to a request admitted when the
	// key was valid (only the filter sends charges, with the decision
	// credential, and only for requests it admitted): a key revoked or
	// expired since still pays it. Refused, every response in flight when
	// a key ran out went unpaid (an outsider timed a burst before its
	// key's expiry: 5,600 tokens served against a budget of 1,500).
	if rec.Status == apikeys.StatusRevoked && !charging {
		return &apierr.Error{Kind: apierr.KindForbidden, Code: wire.CodeAPIKeyRevoked,
			Message: "This API key has been revoked and can no longer be used",
			Details: map[string]any{"revoked_at": rec.RevokedAt.Format(time.RFC3339)}}
	}
	if rec.Expired(s.now()) && !charging {
		return &apierr.Error{Kind: apierr.KindForbidden, Code: wire.CodeAPIKeyExpired,
			Message: "This API key has expired", Details: map[string]any{"expired_at": rec.ExpiresAt.Format(time.RFC3339)}}
	}
	switch c.id.Kind {
	case identity.KindUser:
		// A verified subject presenting a key: the key is charged (its
		// counters, its usage), so its tier is never borrowed for free by
		// callers who share it; the subject still counts for user rules
		// and its address (client_address) for ip rules.
		c.keyUser = c.id.Value
	default:
		// The filter presents a key caller by its client address: that
		// address still counts for ip rules, and the key's user for user
		// rules.
		if c.id.Kind == identity.KindIP && c.id.Value != identity.UnknownIP.Value {
			c.address = c.id.Value
		}
		// Read as the admin API reads it when the key is made (keys made
		// before it did keep "user:bob" as typed: still bob).
		uid, err := identity.Parse(rec.UserID)
		switch {
		case err == nil && uid.Kind == identity.KindUser:
			c.keyUser = uid.Value
		case err != nil && rec.UserID != "":
			// A user id stored before the characters it holds were
			// refused counts under the name the filter gives a token
			// subject that cannot be shown (identity.Digested): with that
			// subject's tokens, as before. Dropped, its keys left the
			// user's limit (attack 55 F3).
			c.keyUser = identity.Digested(sha256.Sum256([]byte(strings.TrimPrefix(rec.UserID, string(identity.KindUser)+":"))))
		}
	}
	c.setID(identity.ID{Kind: identity.KindKey, Value: rec.ID})
	if reqTier == "" {
		if t := p.KeyTier(rec.TierID, rec.Tier); t != "" {
			c.tier = t
		}
	}
	return nil
}

// maskKey is what an error may say of a key a client sent: at most its
// first quarter, up to 12 bytes, printable ASCII only, and never enough to
// use it.
func maskKey(raw string) string {
	n := min(len(raw)/4, 12)
	b := make([]byte, 0, n+3)
	for i := 0; i < n; i++ {
		c := raw[i]
		if c < 0x21 || c > 0x7e {
			c = '?'
		}
		b = append(b, c)
	}
	return string(b) + "..."
}

// applied is one rule's outcome for one check: its counter and the answer.
type applied struct {
	req limiter.Request
	res limiter.Result
	at  time.Time // when res came back (its ResetAfter counts from then)
}

// selectRules returns the rules of a caller, with their counters.
func (s *Service) selectRules(p *view, t *target, adhoc *rules.Rule) []applied {
	var matched, viaScript []*rules.Rule
	switch {
	case adhoc != nil:
		matched = []*rules.Rule{adhoc}
	default:
		var buf [6]*rules.Rule
		matched, viaScript = p.MatchScript(buf[:0], t.rulesRequest(), t.script)
		if t.overrideOnly {
			matched = addedBy(p, t, matched)
		}
		if ov, ok := s.overrides.Get(t.name, t.endpoint); ok {
			if r, _ := p.adhocRule(rules.IDOverride, &ov.Limit, &ov.WindowSeconds, string(ov.Algorithm), ov.Burst); r != nil {
				matched = withOverride(r, matched, t)
			}
		}
	}
	out := make([]applied, len(matched))
	now := s.now()
	for i, r := range matched {
		endpoint := t.endpoint
		if slices.Contains(viaScript, r) {
			endpoint = t.script
		}
		r, origin := inPeriod(r, now)
		out[i] = applied{req: limiter.Request{Owner: limiter.Owner(r, t.idFor(r.Scope), t.tenant), Rule: r, Endpoint: endpoint, Origin: origin}}
	}
	return out
}

// withOverride puts an operator's override of a caller's limit in place of
// the rules that count that caller itself (the identity scope, its tier and
// the tier's total among them, and the scope of the caller's own kind:
// user, api_key or ip); the rules of every other scope still count it. An
// override that replaced them all let one caller through a limit every
// caller shares, or its address's login limit (an outsider's attack: 30
// through a global limit of 5 and an address's of 3). An override-only
// check (t.overrideOnly) counts only what its method adds: the override
// counted the request with its headers.
func withOverride(r *rules.Rule, matched []*rules.Rule, t *target) []*rules.Rule {
	own := map[identity.Kind]rules.Scope{identity.KindUser: rules.ScopeUser, identity.KindKey: rules.ScopeAPIKey, identity.KindIP: rules.ScopeIP}[t.id.Kind]
	out := make([]*rules.Rule, 0, len(matched)+1)
	if !t.overrideOnly {
		out = append(out, r)
	}
	for _, m := range matched {
		if m.Scope != rules.ScopeIdentity && m.Scope != own {
			out = append(out, m)
		}
	}
	return out
}

// addedBy is what of matched (t's rules with its method override) the
// override adds to the rules of t's own method: the rules a second check
// counts once the override is known (wire.CheckRequest.OverrideOnly).
func addedBy(p *view, t *target, matched []*rules.Rule) []*rules.Rule {
	req := t.rulesRequest()
	req.MethodOverride = ""
	var buf [6]*rules.Rule
	own, _ := p.MatchScript(buf[:0], req, t.script)
	added := matched[:0:0]
	for _, r := range matched {
		if !slices.Contains(own, r) {
			added = append(added, r)
		}
	}
	return added
}

// Check decides one request. Errors are *apierr.Error.
func (s *Service) Check(ctx context.Context, req *wire.CheckRequest, trust Trust) (wire.CheckResponse, error) {
	start := time.Now()
	resp, endpoint, err := s.check(ctx, req, trust)
	took := time.Since(start)
	s.m.CheckTook(took.Seconds())
	if err == nil && s.summary != nil {
		// A decision (an error decided nothing): the deployment's summary
		// counts it.
		s.summary.Observe(summary.Observation{At: s.now(), Throttled: !resp.Allowed, Tier: cmp.Or(resp.Tier, "(none)"),
			Endpoint: endpoint, Identity: resp.Identity, Latency: took})
	}
	return resp, err
}

// check is Check; it also returns the normalised endpoint decided on.
func (s *Service) check(ctx context.Context, req *wire.CheckRequest, trust Trust) (wire.CheckResponse, string, error) {
	p := s.live.Load()
	c, aerr := p.validate(req, trust)
	if aerr != nil {
		return wire.CheckResponse{}, "", aerr
	}
	resp, err := s.checkValid(ctx, p, c, req)
	return resp, c.endpoint, err
}

// checkValid decides a validated check.
func (s *Service) checkValid(ctx context.Context, p *view, c *caller, req *wire.CheckRequest) (wire.CheckResponse, error) {
	unverified := false // a key Redis could not be asked about
	if req.APIKey != "" {
		if err := s.resolveKey(ctx, p, c, req.APIKey, req.Tier, false); err != nil {
			var ae *apierr.Error
			switch {
			case errors.As(err, &ae):
				return s.refuseKey(ctx, p, c, ae)
			case p.FailureMode == config.FailClosed:
				return s.failure(p, c, nil, fmt.Errorf("look up api key: %w", err))
			}
			// fail_open with the key unknowable: it buys nothing. The
			// request is the caller's the filter presented (its address or
			// subject), counted as every request is while Redis is down,
			// and refused where a key is required: access control does not
			// fail open. Answered degraded and uncounted, as it was until
			// 2026-11-26, any well-formed key walked around every limit
			// and past require_api_key for as long as Redis was down.
			if !errors.Is(err, ErrBreakerOpen) {
				s.log.Warn("redis unavailable for an api key; the request is decided without it", "err", err)
			}
			unverified = true
		}
	}
	if (req.APIKey == "" || unverified) && c.id.Kind != identity.KindKey && p.KeyRequired(c.tier, c.endpoint, c.script) {
		if unverified {
			// A 503 the filter passes on whatever its own failure_mode
			// (its fallback would admit the request).
			e := apierr.Unavailable("the API key cannot be verified now", ErrKeyUnverifiable)
			e.Details = map[string]any{"failure_mode": config.FailClosed}
			return wire.CheckResponse{}, e
		}
		return s.refuseKey(ctx, p, c, apierr.New(apierr.KindUnauthorized, wire.CodeMissingAPIKey,
			"This endpoint requires an API key (X-API-Key header)"))
	}
	if p.Disabled {
		// Rate limiting is off: admitted as exempt, nothing counted. API
		// keys are access control, not rate limiting: they were checked
		// above all the same.
		s.m.Decided(metrics.Disabled, c.tier, rules.IDExempt)
		return wire.CheckResponse{Allowed: true, RuleID: rules.IDExempt, Identity: c.name, Tier: c.tier}, nil
	}
	return s.decide(ctx, p, c)
}

// refuseKey answers a request refused for its API key (missing where one is
// required, malformed, unknown, revoked, expired). The request still counts
// as its address's, like an anonymous one: otherwise guessing keys, or
// replaying a revoked one, would cost a client nothing and every attempt a
// callout and a Redis lookup. A verified subject's counts for the address
// the filter sent it with (until 2026-11-26 it did not count at all: an
// outsider's 300 refused keys in a row were 401s, never a 429), as an
// anonymous request from there: the subject's tier and tenant are not the
// address's. Once the address is spent the answer is its 429; until then,
// the key's refusal.
func (s *Service) refuseKey(ctx context.Context, p *view, c *caller, refusal *apierr.Error) (wire.CheckResponse, error) {
	switch {
	case p.Disabled:
		return wire.CheckResponse{}, refusal
	case c.id.Kind == identity.KindUser && c.address != "":
		a := *c
		a.setID(identity.ID{Kind: identity.KindIP, Value: c.address})
		a.address, a.keyUser, a.tier, a.tenant = "", "", p.Tier(""), ""
		c = &a
	case c.id.Kind != identity.KindIP || c.id.Value == identity.UnknownIP.Value:
		return wire.CheckResponse{}, refusal
	}
	// The lease, its refund and its report belong to the key's bucket, not
	// this one.
	c.lease, c.returned, c.spent, c.chargeReturned, c.refused = 0, 0, 0, 0, true
	if resp, err := s.decide(ctx, p, c); err == nil && !resp.Allowed {
		return resp, nil
	}
	return wire.CheckResponse{}, refusal
}

// decide runs the caller's rules once its identity and tier are settled.
func (s *Service) decide(ctx context.Context, p *view, c *caller) (wire.CheckResponse, error) {
	if c.returnOnly {
		if !p.Exempt(c.id, c.name) {
			s.handBack(ctx, c, s.selectRules(p, &c.target, c.adhoc))
		}
		if c.spent > 0 && !c.refused {
			s.usage.Record(c.name, s.now(), c.spent, nil) // requests made on the lease
		}
		return wire.CheckResponse{Allowed: true, Identity: c.name, Tier: c.tier}, nil
	}
	if p.Exempt(c.id, c.name) {
		if !c.refused {
			s.m.Decided(metrics.Exempt, c.tier, rules.IDExempt)
			s.usage.Record(c.name, s.now(), c.cost+c.spent, nil)
		}
		return wire.CheckResponse{Allowed: true, RuleID: rules.IDExempt, Identity: c.name, Tier: c.tier,
			Lease: wire.Lease{Granted: c.lease, TTLMs: p.Lease.TTLMs}}, nil
	}
	rs := s.selectRules(p, &c.target, c.adhoc)
	if len(rs) == 0 {
		// Unreachable with a valid config (every tier has a default rule),
		// but an empty answer must still be a decision.
		return wire.CheckResponse{Allowed: true, Identity: c.name, Tier: c.tier}, nil
	}
	// Each rule's cost (and a metered rule's admission threshold) is set
	// on its request here, for every rule the request matches: until
	// 2026-11-26 they were kept for the first eight only, and a ninth
	// metered rule charged 1 whatever the request declared (an outsider's
	// 100 requests of 100 units each spent a budget of 100).
	metered := false // a rule takes its cost from the request
	for i := range rs {
		// Refuse before anything is spent: a rejected request touches
		// nothing. Compared by division: the product of a request's cost
		// and a rule's (up to 2^53) would overflow.
		r := rs[i].req.Rule
		if r.CostFrom != "" {
			metered = true
			n, aerr := c.ruleCost(r)
			if aerr != nil {
				return wire.CheckResponse{}, aerr
			}
			if n > r.Capacity() {
				return wire.CheckResponse{}, apierr.Invalid("cost", fmt.Sprintf("%d, from the request, is more than rule %s can ever allow (%d)", n, r.ID, r.Capacity()))
			}
			admit, aerr := c.ruleAdmit(r)
			if aerr != nil {
				return wire.CheckResponse{}, aerr
			}
			if src, _ := rules.CostSourceOf(r.CostFrom); c.chargeNow && src.AfterResponse() {
				// No charge follows (the gRPC rate limit service): the
				// response's cost is spent now, as an unreported
				// response's (an outsider's 1,000 answers through it
				// spent a 1,500-token budget one token each), or the
				// reserve when more (at a cost of 100, 10 completions
				// through a 1,000-token budget with a reserve of 500:
				// attack 60 A2).
				n = max(n, r.UnreportedCost(), admit, r.Reserve)
			} else if src.AfterResponse() && r.Reserve > 0 {
				// Held until the charge, so that what one caller has in
				// flight is bounded by what it has left: admitting on 1
				// left, an outsider's 1,000 requests at once against a
				// budget of 2,000 tokens were served 3.7 million. What is
				// held is what must be left: the reserve, or the
				// estimate when more (holding the reserve only, a client
				// declaring what was left each time had 10 requests in
				// flight, 55,000 tokens against 10,000: attack 58 F1).
				admit = max(admit, r.Reserve)
				rs[i].req.Reserve = max(admit-n, 0)
			}
			rs[i].req.Cost, rs[i].req.Admit = n, admit
			continue
		}
		if c.cost > r.Capacity()/r.EffectiveCost() {
			return wire.CheckResponse{}, apierr.Invalid("cost", fmt.Sprintf("%d (times the rule's cost %d) is more than rule %s can ever allow (%d)", c.cost, r.EffectiveCost(), r.ID, r.Capacity()))
		}
		rs[i].req.Cost = c.cost * r.EffectiveCost()
	}
	// A lease is one bucket of the filter's, spent only on requests every
	// rule here counts: each rule grants it from its own counter, asked for
	// no more than the rules before it granted, and a grant beyond the
	// least (every grant, when the request is refused) is given back at
	// once. So the filter never spends a token some counter did not take.
	// A response-cost rule's lease is a second pool, of its own tokens
	// (chargeLease): a request admitted on the lease spends one of each.
	want, pool := c.lease, -1
	var poolWant, poolGranted int64
	if metered {
		// Leased tokens are spent one a request: a request whose cost the
		// request says must come here each time.
		want = 0
		if pool, poolWant = chargeLease(rs, c); pool >= 0 {
			want = c.lease
		}
	}
	throttled, degraded := false, false
	for i := range rs {
		a := &rs[i]
		lr := a.req
		lr.LeaseFraction = p.Lease.Fraction
		lr.Lease, lr.Returned, lr.LeasedAt, lr.WarmLeaseOnly = want, c.returned, c.leasedAt, len(rs) > 1
		if i == pool {
			lr.Lease, lr.Returned, lr.LeasedAt = poolWant, c.chargeReturned, c.chargeLeasedAt
		}
		if !a.req.Rule.Scope.Shared() {
			lr.Penalty = p.Penalty
		}
		res, local, err := s.limitOrLocal(ctx, p, lr)
		if err != nil {
			s.unreserve(ctx, rs[:i])
			return s.failure(p, c, a.req.Rule, err)
		}
		degraded = degraded || local
		if !res.Allowed && a.req.Rule.Action == rules.ActionThrottle && !throttled &&
			res.RetryAfter <= p.ThrottleMaxWait && s.sleep(ctx, res.RetryAfter) {
			// Throttled, once per request: wait until the rule would admit
			// it, then ask this rule again (the rules before it were
			// spent already; asked again they would count it twice).
			throttled = true
			lr.Returned = 0 // the first call took the refund already
			if res, local, err = s.limitOrLocal(ctx, p, lr); err != nil {
				s.unreserve(ctx, rs[:i])
				return s.failure(p, c, a.req.Rule, err)
			}
			degraded = degraded || local
		}
		a.res, a.at = res, s.now()
		if i == pool {
			poolGranted = res.Granted
		} else {
			want = min(want, res.Granted)
		}
		if !res.Allowed {
			want = 0
			if a.req.Rule.Action != rules.ActionLogOnly {
				// Refused: the rules after this one are not asked, so a
				// refused request creates no counter of theirs.
				rs = rs[:i+1]
				break
			}
		}
	}
	if pool >= 0 && (want == 0 || poolGranted == 0) {
		// A request is admitted on the lease only with a token of each.
		want, poolGranted = 0, 0
	}
	if (want > 0 || poolGranted > 0) && leaseTTL(p, rs, s.now()) <= 0 {
		// A window ended while the request waited (a throttled rule): the
		// lease could not be spent; the counters take it back below.
		want, poolGranted = 0, 0
	}
	for i := range rs {
		a := &rs[i]
		keep := want
		if i == pool {
			keep = poolGranted
		}
		if excess := a.res.Granted - keep; excess > 0 {
			s.giveBack(ctx, a.req, excess, a.res.WindowStart)
			a.res.Granted = keep
		}
	}
	resp, result := s.verdict(p, &c.target, rs, want, poolGranted, pool)
	if degraded {
		// Counted here only: said so, and nothing leased.
		resp.Degraded, resp.Lease = true, wire.Lease{}
		if resp.Allowed {
			result = metrics.Degraded
		}
	}
	if p.Shadow && !resp.Allowed {
		// Shadow mode: the request passes as a log-only rule's would, its
		// numbers saying what would have happened.
		resp.Allowed, resp.LogOnly, resp.RetryAfter, resp.Refusal, result = true, true, 0, nil, metrics.LogOnly
	}
	if resp.Allowed && !c.refused && !c.chargeNow {
		resp.Charges = charges(rs)
	} else {
		// No charge will hand back what was held (a request refused by a
		// rule after the one that reserved, a refused key's): it goes
		// back now.
		s.unreserve(ctx, rs)
	}
	var refused int64 // what a refused request asked of a rule that counts tokens
	for i := range rs {
		if r := rs[i].req.Rule; !resp.Allowed && r.ID == resp.RuleID && r.CostFrom != "" {
			refused = max(rs[i].req.Cost, rs[i].req.Admit)
		}
	}
	s.record(c, &resp, refused)
	if !c.refused || !resp.Allowed {
		// A refused key's request that the rules let through is answered
		// with the refusal: it is no allowed decision.
		s.m.Decided(result, c.tier, resp.RuleID)
	}
	s.m.LeaseGranted.Add(float64(resp.Lease.Granted))
	for i := range rs {
		if rs[i].res.Penalized {
			s.m.Penalties.Inc()
			break
		}
	}
	return resp, nil
}

// sleepCtx waits d unless ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// giveBack returns tokens a counter granted beyond the lease the filter
// gets, to the window they came from (leasedAt: the grant's WindowStart).
// A failure only leaves them spent until the counter refills: the limiter
// under-admits, never over-admits.
func (s *Service) giveBack(ctx context.Context, r limiter.Request, n, leasedAt int64) {
	// A hand-back only: the request's own cost (decide keeps it on r)
	// was counted when it was asked.
	r.Cost, r.Admit, r.Lease, r.Reserve = 0, 0, 0, 0
	r.Returned, r.LeasedAt = n, leasedAt
	if _, err := s.limit(ctx, r); err != nil {
		s.log.Debug("lease excess not given back", "rule", r.Rule.ID, "err", err)
	}
}

// unreserve hands back what rules of a request no charge will follow
// reserved for it.
func (s *Service) unreserve(ctx context.Context, rs []applied) {
	for i := range rs {
		if a := &rs[i]; a.res.Reserved > 0 {
			s.giveBack(ctx, a.req, a.res.Reserved, a.res.WindowStart)
			a.res.Reserved = 0
		}
	}
}

// handBack is a return-only check's (wire.CheckRequest.ReturnOnly): the
// filter hands back a lease that ended with tokens left, of a bucket no
// request came back to. Each counter of the request's rules takes back
// what it leased, in the window it leased it from (leased_at), as a
// check's returned would. Nothing is spent.
func (s *Service) handBack(ctx context.Context, c *caller, rs []applied) {
	pool := chargePool(rs)
	for i := range rs {
		n, at := c.returned, c.leasedAt
		if i == pool {
			n, at = c.chargeReturned, c.chargeLeasedAt
		}
		if n > 0 {
			s.giveBack(ctx, rs[i].req, n, at)
		}
	}
}

// record counts the requests made for usage: this one (its cost) when it
// is admitted, and the lease tokens the filter reports it spent since its
// last check (spent), admitted or not; a denial is a violation. Tokens
// leased but not yet spent are not requests: they count once reported.
// It only adds to memory.
func (s *Service) record(c *caller, resp *wire.CheckResponse, cost int64) {
	now := s.now()
	if !resp.Allowed {
		// The endpoint is the client's choice, up to 8 KiB: the trail keeps
		// its first 256 bytes, so that a caller refused at its limit cannot
		// fill the trail's memory with long paths. A rule that counts
		// tokens counts its violations in tokens (cost: what the request
		// asked for).
		s.usage.Record(c.name, now, c.spent, &audit.Event{At: now, Type: audit.TypeViolation,
			Identity: clip(c.name, maxTrailField), Endpoint: clip(c.endpoint, maxTrailField), RuleID: resp.RuleID, Cost: cost})
		return
	}
	if !c.refused {
		s.usage.Record(c.name, now, c.cost+c.spent, nil)
	}
}

// limitOrLocal runs one counter in Redis; when Redis cannot be reached and
// the failure mode is fail_open, it counts in this process instead (local
// is then true) at the rule's limit divided by the replicas, until Redis
// answers again (the breaker's probe hands decisions back to it).
func (s *Service) limitOrLocal(ctx context.Context, p *view, lr limiter.Request) (limiter.Result, bool, error) {
	res, err := s.limit(ctx, lr)
	if err == nil || s.local == nil || p.FailureMode != config.FailOpen || ctx.Err() != nil ||
		errors.Is(err, limiter.ErrBadRequest) || errors.Is(err, limiter.ErrScript) {
		return res, false, err
	}
	lr.Lease, lr.Returned, lr.Reserve, lr.Release = 0, 0, 0, 0
	if src, _ := rules.CostSourceOf(lr.Rule.CostFrom); src.AfterResponse() && !lr.Charge && !lr.Peek {
		// In memory, a check and the charge of its response are two calls
		// a proxy spreads over the replicas: a replica may count a caller's
		// admissions and never their charges (an outsider's round robin:
		// 750 answers where the budget allowed 4). So an admission counted
		// here spends what an unreported response costs (the rule's cost,
		// or the estimate when more), as if no charge were to come; a
		// charge that comes still spends where it lands. During an outage
		// such a caller is counted more than its answers cost, never less.
		lr.Cost = max(lr.Cost, lr.Rule.UnreportedCost(), lr.Admit)
	}
	return s.local.Do(lr), true, nil
}

// limit runs one counter through the circuit breaker.
func (s *Service) limit(ctx context.Context, lr limiter.Request) (res limiter.Result, err error) {
	err = s.guarded(ctx, "check", func() error {
		res, err = s.counters.Do(ctx, lr)
		return err
	})
	return res, err
}

// guarded runs one Redis call of the decision path through the circuit
// breaker: while it is open the call is not made and ErrBreakerOpen is
// returned, so a dead Redis costs a check nothing.
func (s *Service) guarded(ctx context.Context, op string, call func() error) error {
	if !s.breaker.Allow(s.now().UnixNano()) {
		return ErrBreakerOpen
	}
	err := call()
	if err != nil && limiter.SaysNothing(ctx, err) {
		return err
	}
	if err != nil && s.summary != nil {
		s.summary.RedisError(s.now())
	}
	if limiter.Tell(s.breaker, err, s.now().UnixNano()) {
		if err != nil {
			s.log.Error("redis failing; circuit breaker open, answering by the failure mode", "mode", s.live.Load().FailureMode, "err", err)
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
// least left. It also names the result for the decisions metric. pool is
// the rule whose counter granted chargeGranted (-1: none).
func (s *Service) verdict(p *view, t *target, rs []applied, granted, chargeGranted int64, pool int) (wire.CheckResponse, string) {
	var decider *applied
	denied, logOnly := false, false
	for i := range rs {
		a := &rs[i]
		if a.res.Allowed {
			continue
		}
		if a.req.Rule.Action == rules.ActionLogOnly {
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
			// The fewest requests left is the rule a client meets first;
			// a tie goes to the smaller counter.
			if decider == nil || a.res.Remaining < decider.res.Remaining ||
				a.res.Remaining == decider.res.Remaining && a.req.Rule.Capacity() < decider.req.Rule.Capacity() {
				decider = a
			}
		}
	}
	now := s.now()
	resp := wire.CheckResponse{
		Allowed:       !denied,
		Limit:         decider.req.Rule.Capacity(),
		Quota:         decider.req.Rule.Limit,
		Remaining:     decider.res.Remaining,
		ResetAt:       ceilUnix(now.Add(decider.res.ResetAfter)),
		Strategy:      string(decider.req.Rule.Algorithm),
		WindowSeconds: decider.req.Rule.WindowSeconds,
		RuleID:        decider.req.Rule.ID,
		Identity:      t.name,
		Tier:          t.tier,
		LogOnly:       logOnly,
	}
	result := metrics.Allowed
	switch {
	case denied:
		result = metrics.Denied
		wait := decider.res.RetryAfter
		if f := p.RetryAfterJitter; f > 0 {
			// Callers refused together come back spread over the next
			// f x wait, not in one wave; never sooner than admitted.
			wait += time.Duration(float64(wait) * f * s.rand())
		}
		resp.RetryAfter = max(1, ceilSeconds(wait))
		// The deciding rule's own refusal goes with the answer, for the
		// filter (or the caller of this API) to answer the client with.
		resp.Refusal = decider.req.Rule.Response
		// Reset never names a time before a retry would be admitted (a
		// sliding window's end can come before the weighted wait ends): a
		// client that comes back at Reset must not be refused, and counted
		// as another violation.
		resp.ResetAt = max(resp.ResetAt, ceilUnix(now.Add(decider.res.RetryAfter)))

	case logOnly:
		result = metrics.LogOnly
	}
	if o := decider.req.Origin; o > 0 {
		// A calendar period resets at its end, to the second: what the
		// clocks' difference would round past it is not a wait.
		resp.ResetAt = o/1000 + decider.req.Rule.WindowSeconds
	}
	// decide gave every rule the same grant (a response-cost rule's pool
	// its own).
	if g := granted; g > 0 && !denied && !logOnly {
		ttl := max(leaseTTL(p, rs, now), 0)
		// leased_at is a moment inside the stretch of every counter that
		// granted the lease (a window; a bucket's time since it was last
		// full), for each to credit its hand-back only there (prelude.lua):
		// the latest of their starts, before the earliest of their ends.
		// The pool's tokens came from its rule's counter alone: its own
		// start (two fast buckets' stretches, a fraction of a millisecond
		// each, often share no moment, and took the pool's hand-backs
		// with them).
		var leasedAt, firstEnd, chargeLeasedAt int64
		for i, a := range rs {
			if i == pool {
				chargeLeasedAt = a.res.WindowStart
			} else if a.res.WindowStart > 0 {
				leasedAt = max(leasedAt, a.res.WindowStart)
				if firstEnd == 0 || a.res.WindowEnd < firstEnd {
					firstEnd = a.res.WindowEnd
				}
			}
		}
		if leasedAt >= firstEnd {
			// No moment shared (counters on Redis servers whose clocks
			// disagree; a bucket that may be full again before another
			// counter's stretch began): its hand-backs credit nothing.
			leasedAt = 0
		}
		resp.Lease = wire.Lease{Granted: g, TTLMs: ttl.Milliseconds(), LeasedAt: leasedAt}
		if chargeGranted > 0 {
			resp.Lease.ChargeGranted, resp.Lease.ChargeLeasedAt = chargeGranted, chargeLeasedAt
		}
	}
	return resp, result
}

// leaseTTL is how long a lease of rs's counters may be spent: the
// configured TTL, and never past a window's end, which is ResetAfter from
// when its counter answered (a throttled rule after it slept up to its
// wait, and an outsider's leases lived 65 ms into the next window: 254
// admitted of 200). The caller counts it from when it sent the check,
// before any counter answered (the decision API says so; the filter's
// keepLease): the answer's way back costs the lease nothing of its window.
// A script rounds ResetAfter up to a whole millisecond: that one comes off.
func leaseTTL(p *view, rs []applied, now time.Time) time.Duration {
	ttl := time.Duration(p.Lease.TTLMs) * time.Millisecond
	for _, a := range rs {
		if a.req.Rule.Algorithm != rules.TokenBucket && a.req.Rule.Algorithm != rules.GCRA {
			ttl = min(ttl, a.res.ResetAfter-now.Sub(a.at)-time.Millisecond)
		}
	}
	return ttl
}

// failure applies the failure mode to a Redis error.
func (s *Service) failure(p *view, c *caller, r *rules.Rule, err error) (wire.CheckResponse, error) {
	if errors.Is(err, limiter.ErrBadRequest) || errors.Is(err, limiter.ErrScript) {
		// This rule's fault, not Redis's: a 500 for requests it decides,
		// logged with the rule; every other rule and caller goes on.
		s.log.Error("limiter script failed; answering 500 for this rule", "err", err)
		return wire.CheckResponse{}, apierr.Failed(err)
	}
	if !errors.Is(err, ErrBreakerOpen) {
		s.log.Warn("redis unavailable for a check", "mode", p.FailureMode, "err", err)
	}
	if p.FailureMode == config.FailClosed {
		// The filter reads failure_mode and answers 503 too, whatever its
		// own setting: the service's mode is the one source of truth
		// whenever the service answers.
		e := apierr.Unavailable("rate limiter unavailable", err)
		e.Details = map[string]any{"failure_mode": config.FailClosed}
		return wire.CheckResponse{}, e
	}
	s.m.Decided(metrics.Degraded, c.tier, "")
	// Nothing was counted: the answer names the rule but no numbers it
	// cannot know (limit, remaining, reset), so no rate-limit headers follow.
	resp := wire.CheckResponse{Allowed: true, Degraded: true, Identity: c.name, Tier: c.tier}
	if r != nil {
		resp.Strategy, resp.WindowSeconds, resp.RuleID = string(r.Algorithm), r.WindowSeconds, r.ID
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
