package decision

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Trust is what a caller of the decision API proved.
type Trust bool

const (
	// Untrusted callers (no service credential) may use the plain check
	// shape only.
	Untrusted Trust = false
	// Trusted callers hold a decision token (the filter): they may name
	// tiers, tenants, costs, leases, refunds and key identities. Admin
	// routes (reset, overrides) act as trusted behind the admin token.
	Trusted Trust = true
)

// subject is what an entry point (check, batch, status, reset, override)
// says about a caller, before validation. Only checks spend: the amounts are
// 0 elsewhere.
type subject struct {
	userID, endpoint, method, tier, tenant string
	methodOverride                         string
	overrideOnly, returnOnly               bool
	cost, lease, returned, spent           int64
	chargeReturned, leasedAt               int64
	chargeLeasedAt                         int64
	address                                string // client_address
}

// target is a validated subject: who the request is about (canonical
// identity, configured tier, tenant) and what (normalised endpoint, method).
// Every entry point builds its target through view.target, in one place.
type target struct {
	id       identity.ID
	name     string // id.String(), made once: a check needs it several times
	tier     string
	tenant   string
	endpoint string
	// script is the PHP script that runs the endpoint with path info ("" if
	// none): rules naming its path count the request too (MatchScript).
	script string
	method string
	// methodOverride is the method an override header names: rules on it
	// count the request too. overrideOnly: only they do (wire.CheckRequest).
	methodOverride string
	overrideOnly   bool
	// address is the client address of a caller identified otherwise (an
	// API-key caller presented by it, a JWT subject the filter sent it
	// with; "" when unknown), keyUser its key's user id: the ip and user
	// scopes count these (idFor).
	address, keyUser string
}

func (t *target) setID(id identity.ID) { t.id, t.name = id, id.String() }

// idFor is the identity a rule of scope s counts for this caller: the
// client address for the ip scope and the key's user for the user scope
// when the caller is identified by an API key, else its own.
func (t *target) idFor(s rules.Scope) identity.ID {
	switch {
	case s == rules.ScopeIP && t.address != "":
		return identity.ID{Kind: identity.KindIP, Value: t.address}
	case s == rules.ScopeUser && t.keyUser != "":
		return identity.ID{Kind: identity.KindUser, Value: t.keyUser}
	}
	return t.id
}

// rulesRequest is what rule matching reads of the caller.
func (t *target) rulesRequest() rules.Request {
	return rules.Request{Tier: t.tier, Method: t.method, MethodOverride: t.methodOverride, Path: t.endpoint, IdentityKind: t.id.Kind, Tenant: t.tenant,
		KeyUser: t.keyUser != "", ClientAddress: t.address != ""}
}

// caller is a validated check: its target and what it spends.
type caller struct {
	target
	cost     int64
	lease    int64
	returned int64
	// returnOnly: the check only hands back a lease that ended (handBack).
	returnOnly bool
	// chargeNow: no charge follows the response (wire.CheckRequest.ChargeNow).
	chargeNow bool
	spent     int64 // lease tokens the filter reports spending since its last check
	// leaseCharges: the filter can spend a lease under a response-cost
	// rule (chargeLease); chargeReturned hands back that rule's tokens of
	// an earlier one.
	leaseCharges   bool
	chargeReturned int64
	// leasedAt and chargeLeasedAt are the stamps of the lease the
	// hand-backs come from (limiter.Request.LeasedAt).
	leasedAt, chargeLeasedAt int64
	adhoc                    *rules.Rule // the check's own limit, if it gave one
	// refused: the request is answered with its key's refusal whatever the
	// rules say, so it is counted but never recorded as admitted usage.
	refused bool
	// What rules with a cost_from read: the body's size (nil: unknown) and
	// the cost headers the filter sent.
	bodyBytes   *int64
	costHeaders map[string]string
}

// maxCostHeaders bounds the cost headers a check may carry.
const maxCostHeaders = 8

// ruleCost is what this request spends from rule r's counter: the rule's
// cost_from read from the request, or the check's cost times the rule's.
// A value from the request is never below 1: a client choosing 0 or
// leaving the header out gets no free request.
func (c *caller) ruleCost(r *rules.Rule) (int64, *apierr.Error) {
	src, name := rules.CostSourceOf(r.CostFrom) // validated with the policy
	var n int64
	switch src {
	case rules.CostRequestHeader:
		v, ok := c.costHeaders[name]
		if !ok {
			return c.cost * r.EffectiveCost(), nil
		}
		var err error
		if n, err = strconv.ParseInt(v, 10, 64); err != nil || n < 0 || n > rules.MaxQuantity {
			return 0, apierr.Invalid("cost_headers["+strconv.Quote(name)+"]", fmt.Sprintf("%q is not a whole number of 0 or more (rule %s takes its cost from it)", clip(v, 32), r.ID))
		}
	case rules.CostResponseHeader, rules.CostResponseJSON:
		// Known after the response: admission spends 1, the charge the
		// rest (Charge).
		return 1, nil
	case rules.CostBodyBytes:
		if c.bodyBytes == nil {
			return 0, apierr.Invalid("body_bytes", "is unknown (a chunked body): rule "+r.ID+" counts the body's bytes; send Content-Length")
		}
		n = *c.bodyBytes
	default:
		return c.cost * r.EffectiveCost(), nil
	}
	return max(n, 1), nil
}

// ruleAdmit is what must be left for rule r to admit this request: its
// estimate_from's header when it names one and the request sends it (a
// number of 1 or more), else 0 (the cost). An estimate above the rule's
// capacity could never be admitted and is refused as such.
func (c *caller) ruleAdmit(r *rules.Rule) (int64, *apierr.Error) {
	if r.EstimateFrom == "" {
		return 0, nil
	}
	_, name := rules.CostSourceOf(r.EstimateFrom) // validated with the policy
	v, ok := c.costHeaders[name]
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil || n < 0 || n > rules.MaxQuantity:
		return 0, apierr.Invalid("cost_headers["+strconv.Quote(name)+"]", fmt.Sprintf("%q is not a whole number of 0 or more (rule %s admits a request only while that much is left)", clip(v, 32), r.ID))
	case n > r.Capacity():
		return 0, apierr.Invalid("cost_headers["+strconv.Quote(name)+"]", fmt.Sprintf("%d is more than rule %s can ever have left (%d)", n, r.ID, r.Capacity()))
	}
	return n, nil
}

// target validates a subject. An untrusted caller is refused any field only
// the service credential may send, before the fields' values are checked.
func (p *view) target(in *subject, trust Trust) (target, *apierr.Error) {
	var t target
	if in.userID == "" {
		return t, apierr.Invalid("user_id", "is required")
	}
	id, err := identity.Parse(in.userID)
	if err != nil {
		return t, apierr.InvalidAt("user_id", err)
	}
	if looksLikeKey(id.Value) {
		// Stored as "user:ak_live_..." it would keep a usable key in Redis
		// and the logs, and count for nobody: the key's caller is key:<id>.
		return t, apierr.Invalid("user_id", "is a raw API key; name its caller as key:<key_id> (the raw key is never stored or logged)")
	}
	t.setID(id)
	if trust == Untrusted {
		if aerr := untrusted(in, id); aerr != nil {
			return t, aerr
		}
	}
	if in.address != "" {
		if id.Kind == identity.KindIP {
			return t, apierr.Invalid("client_address", "is for a caller identified otherwise; an address caller's user_id is its address")
		}
		a, err := identity.IP(in.address)
		if err != nil {
			return t, apierr.InvalidAt("client_address", err)
		}
		t.address = a.Value
	}
	if t.endpoint, t.script, err = p.Endpoint(in.endpoint); err != nil {
		return t, apierr.InvalidAt("endpoint", err)
	}
	if in.method != "" && !rules.ValidMethod(in.method) {
		return t, apierr.Invalid("method", "must be an upper-case HTTP method")
	}
	t.method = in.method
	if in.methodOverride != "" && !rules.ValidMethod(in.methodOverride) {
		return t, apierr.Invalid("method_override", "must be an upper-case HTTP method")
	}
	t.methodOverride = in.methodOverride
	if in.overrideOnly && (in.methodOverride == "" || in.methodOverride == in.method) {
		return t, apierr.Invalid("override_only", "needs a method_override other than the method")
	}
	t.overrideOnly = in.overrideOnly
	if in.tier != "" && !rules.ValidTierName(in.tier) {
		return t, apierr.Invalid("tier", "must match ^[a-z0-9_]+$")
	}
	t.tier = p.Tier(in.tier)
	if in.tenant != "" {
		if _, err := identity.User(in.tenant); err != nil {
			return t, apierr.Invalid("tenant", "must be 1..255 printable characters")
		}
		t.tenant = in.tenant
	}
	return t, nil
}

// looksLikeKey reports whether a user id is a raw API key.
func looksLikeKey(v string) bool {
	return (strings.HasPrefix(v, apikeys.Prefix) || strings.HasPrefix(v, apikeys.LegacyPrefix)) && apikeys.ValidFormat(v)
}

// untrusted refuses what a caller without the credential could buy with
// these fields: another tier's quota, another tenant's, an API key's
// identity without the key, tokens credited to a shared bucket, a costly
// script run.
func untrusted(in *subject, id identity.ID) *apierr.Error {
	switch {
	case in.tier != "":
		return apierr.Forbidden("tier")
	case in.tenant != "":
		return apierr.Forbidden("tenant")
	case in.cost > 1:
		return apierr.Forbidden("cost")
	case in.lease != 0:
		return apierr.Forbidden("lease")
	case in.returned != 0:
		return apierr.Forbidden("returned")
	case in.spent != 0:
		return apierr.Forbidden("spent")
	case in.chargeReturned != 0:
		return apierr.Forbidden("charge_returned")
	case in.leasedAt != 0:
		return apierr.Forbidden("leased_at")
	case in.chargeLeasedAt != 0:
		return apierr.Forbidden("charge_leased_at")
	case in.overrideOnly:
		// Would count a request under fewer rules than its own.
		return apierr.Forbidden("override_only")
	case in.returnOnly:
		return apierr.Forbidden("return_only")
	case in.address != "":
		// Would spend another address's per-address quota.
		return apierr.Forbidden("client_address")
	case id.Kind == identity.KindKey:
		return apierr.ForbiddenBecause("user_id", "an API-key identity needs the service credential; present the key itself as api_key")
	}
	return nil
}

// validate checks everything a check says before anything touches Redis.
func (p *view) validate(req *wire.CheckRequest, trust Trust) (*caller, *apierr.Error) {
	t, aerr := p.target(&subject{userID: req.UserID, endpoint: req.Endpoint, method: req.Method, methodOverride: req.MethodOverride, overrideOnly: req.OverrideOnly, returnOnly: req.ReturnOnly, tier: req.Tier, tenant: req.Tenant,
		cost: req.Cost, lease: req.Lease, returned: req.Returned, spent: req.Spent, chargeReturned: req.ChargeReturned, leasedAt: req.LeasedAt, chargeLeasedAt: req.ChargeLeasedAt, address: req.ClientAddress}, trust)
	if aerr != nil {
		return nil, aerr
	}
	c := &caller{target: t}
	switch {
	case req.Cost < 0 || req.Cost > MaxCost:
		return nil, apierr.Invalid("cost", fmt.Sprintf("must be in 0..%d", MaxCost))
	case req.Lease < 0:
		return nil, apierr.Invalid("lease", "must be >= 0")
	case req.Returned < 0 || req.Returned > MaxReturned:
		return nil, apierr.Invalid("returned", fmt.Sprintf("must be in 0..%d", MaxReturned))
	case req.Spent < 0 || req.Spent > MaxReturned:
		return nil, apierr.Invalid("spent", fmt.Sprintf("must be in 0..%d", MaxReturned))
	case req.ChargeReturned < 0 || req.ChargeReturned > MaxReturned:
		return nil, apierr.Invalid("charge_returned", fmt.Sprintf("must be in 0..%d", MaxReturned))
	case req.LeasedAt < 0 || req.LeasedAt > wire.MaxLeasedAt:
		return nil, apierr.Invalid("leased_at", fmt.Sprintf("must be in 0..%d (the lease's own leased_at, sent back as it came)", int64(wire.MaxLeasedAt)))
	case req.ChargeLeasedAt < 0 || req.ChargeLeasedAt > wire.MaxLeasedAt:
		return nil, apierr.Invalid("charge_leased_at", fmt.Sprintf("must be in 0..%d (the lease's own charge_leased_at, sent back as it came)", int64(wire.MaxLeasedAt)))
	case req.ReturnOnly && (req.OverrideOnly || req.Lease != 0):
		return nil, apierr.Invalid("return_only", "hands a lease back: it asks for no lease and is no override_only check")
	case req.ReturnOnly && req.Returned == 0 && req.ChargeReturned == 0 && req.Spent == 0:
		return nil, apierr.Invalid("return_only", "has nothing to hand back (returned, charge_returned and spent are 0)")
	}
	// A caller without the service credential cannot charge (Charge needs
	// it): no charge follows its checks either (an outsider's 51 checks
	// of a token-less service went through a 1,500-token budget at one
	// token each).
	c.returnOnly, c.chargeNow = req.ReturnOnly, req.ChargeNow || trust == Untrusted
	c.cost = max(req.Cost, 1)
	c.lease = min(req.Lease, p.Lease.Max)
	if p.Lease.Fraction == 0 || t.overrideOnly {
		c.lease = 0 // a lease is spent on requests every rule counts
	}
	c.returned, c.spent = req.Returned, req.Spent
	c.leaseCharges, c.chargeReturned = req.LeaseCharges, req.ChargeReturned
	c.leasedAt, c.chargeLeasedAt = req.LeasedAt, req.ChargeLeasedAt
	if req.BodyBytes != nil && (*req.BodyBytes < 0 || *req.BodyBytes > rules.MaxQuantity) {
		return nil, apierr.Invalid("body_bytes", fmt.Sprintf("must be in 0..%d", int64(rules.MaxQuantity)))
	}
	if len(req.CostHeaders) > maxCostHeaders {
		return nil, apierr.Invalid("cost_headers", fmt.Sprintf("at most %d headers", maxCostHeaders))
	}
	for name := range req.CostHeaders {
		// Rules name headers in lower case (rules.CostSourceOf): a name
		// in another case would be read as absent, the rule's default
		// cost, where the caller meant its value.
		if strings.ToLower(name) != name {
			return nil, apierr.Invalid("cost_headers["+strconv.Quote(clip(name, 64))+"]", "header names are lower case")
		}
	}
	c.bodyBytes, c.costHeaders = req.BodyBytes, req.CostHeaders
	r, aerr := p.ownLimit(req.Strategy, req.Limit, req.WindowSeconds)
	if aerr != nil {
		return nil, aerr
	}
	if r != nil && c.cost > r.Capacity() {
		return nil, apierr.Invalid("cost", "is larger than the limit")
	}
	if r != nil && t.overrideOnly {
		return nil, apierr.Invalid("override_only", "counts configured rules; a check naming its own limit has no others")
	}
	c.adhoc = r
	return c, nil
}

// ownLimit is the rule of a limit a check (or a status query) names itself,
// or nil when it names none. A strategy alone is refused: it would be
// silently ignored otherwise.
func (p *view) ownLimit(strategy string, limit, window *int64) (*rules.Rule, *apierr.Error) {
	if aerr := validStrategy(strategy, false); aerr != nil {
		return nil, aerr
	}
	if limit == nil && window == nil {
		if strategy != "" {
			return nil, apierr.InvalidLimit("limit", "is required with strategy: a strategy applies to a limit the request names itself")
		}
		return nil, nil
	}
	return p.adhocRule(rules.IDRequest, limit, window, strategy, 0)
}

// validStrategy checks an algorithm name given in a request.
func validStrategy(s string, required bool) *apierr.Error {
	if s == "" {
		if required {
			return apierr.Invalid("strategy", "is required")
		}
		return nil
	}
	if !rules.ValidAlgorithm(rules.Algorithm(s)) {
		e := apierr.Invalid("strategy", fmt.Sprintf("%q is not one of %v", s, rules.Algorithms))
		e.Code = wire.CodeInvalidStrategy
		return e
	}
	return nil
}

// adhocRule builds the identity-scoped, per-endpoint rule of a limit given in
// a request (check or override). The limit is bounded by max_adhoc_limit, so
// no caller sizes a counter (or a sliding log) at will.
func (p *view) adhocRule(id string, limit, window *int64, strategy string, burst int64) (*rules.Rule, *apierr.Error) {
	if limit == nil {
		return nil, apierr.InvalidLimit("limit", "is required with window_seconds")
	}
	if *limit <= 0 || *limit > p.MaxAdhocLimit {
		return nil, apierr.InvalidLimit("limit", fmt.Sprintf("must be in 1..%d", p.MaxAdhocLimit))
	}
	if burst > p.MaxAdhocLimit {
		return nil, apierr.InvalidLimit("burst_capacity", fmt.Sprintf("must be in 0..%d", p.MaxAdhocLimit))
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
		algo = p.DefaultAlgorithm()
	}
	return &rules.Rule{ID: id, Scope: rules.ScopeIdentity, Algorithm: algo, Limit: *limit, WindowSeconds: w, Burst: burst, PerEndpoint: true}, nil
}
