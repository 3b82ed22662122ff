package rules

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/identity"
)

// Request is what matching needs to know about one request.
type Request struct {
	Tier   string
	Method string
	// MethodOverride is the method a method-override header names ("" for
	// none): a rule on either method matches.
	MethodOverride string
	Path           string
	// IdentityKind decides whether the user, api_key and ip scopes apply.
	IdentityKind identity.Kind
	// KeyUser is true for an API-key caller whose key belongs to a user:
	// the user scope applies to it too (a user's limit holds across all of
	// their keys).
	KeyUser bool
	// ClientAddress is true when the caller's address is known although it
	// is identified otherwise (an API key, a JWT subject): the ip scope applies
	// to it too, so no credential walks around a per-address rule.
	ClientAddress bool
	// Tenant is empty when the caller has none; the tenant scope then does
	// not apply.
	Tenant string
}

// Set is a validated, ordered rule list, ready for matching. The zero Set
// matches nothing.
type Set struct {
	// rules is sorted by scope, then priority (high first), then specificity,
	// then id, so the first match of a scope is its winner.
	rules   []Rule
	version string
}

// NewSet validates rules and orders them for matching. version names the
// snapshot (the filter keys its cache by it).
// MaxResponseCostRules bounds the enabled rules of a set that take their
// cost from the response: a check's answer names each one a request
// matched (wire.MaxCharges), and a rule past them would admit at 1 and
// never be charged. Bounded in the set, no request can match more: a
// request-time refusal instead was a lever (an outsider's six requests
// of a key that matched too many opened every filter's breaker).
const MaxResponseCostRules = 8

func NewSet(version string, rs []Rule) (*Set, error) {
	seen := make(map[string]int, len(rs))
	out := make([]Rule, 0, len(rs))
	responseCost := 0
	for i := range rs {
		r := rs[i]
		if err := r.Validate(); err != nil {
			if fe, ok := fielderr.As(err); ok {
				return nil, fe.In("[" + strconv.Itoa(i) + "]")
			}
			return nil, err
		}
		if j, dup := seen[r.ID]; dup {
			return nil, fielderr.New("["+strconv.Itoa(i)+"].id", "%q is also the id of [%d]", r.ID, j)
		}
		seen[r.ID] = i
		if !r.IsEnabled() {
			continue
		}
		if src, _ := CostSourceOf(r.CostFrom); src.AfterResponse() {
			if responseCost++; responseCost > MaxResponseCostRules {
				return nil, fielderr.New("["+strconv.Itoa(i)+"].cost_from", "at most %d enabled rules take their cost from the response (an answer carries that many charges)", MaxResponseCostRules)
			}
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, compareRules)
	return &Set{rules: out, version: version}, nil
}

func scopeRank(s Scope) int { return slices.Index(Scopes, s) }

func compareRules(a, b Rule) int {
	if c := cmp.Compare(scopeRank(a.Scope), scopeRank(b.Scope)); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
		return c
	}
	al, aw := specificity(a.Path)
	bl, bw := specificity(b.Path)
	if c := cmp.Compare(bl, al); c != 0 {
		return c
	}
	if c := cmp.Compare(aw, bw); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// Version names the snapshot.
func (s *Set) Version() string {
	if s == nil {
		return ""
	}
	return s.version
}

// Rules returns the enabled rules in matching order. Callers must not modify
// them.
func (s *Set) Rules() []Rule {
	if s == nil {
		return nil
	}
	return s.rules
}

// Match appends to dst the winning rule of every scope that applies to req:
// one rule per scope at most, the highest priority, ties to the more specific
// path; and a runtime rule's scope has a winner among the runtime rules
// besides. A request is denied if any returned rule denies it.
func (s *Set) Match(dst []*Rule, req Request) []*Rule {
	if s == nil {
		return dst
	}
	// A log_only rule is a trial of a rule: it is counted and reported
	// beside the scope's winner, never instead of it (a trial that won its
	// scope lifted the limit it was meant to test: an outsider found a
	// more specific log_only rule take a 5-a-minute login rule to the
	// tier's 20). Each scope has one winner among the rules that act, and
	// its first matching log_only rule besides. And the config file's
	// rules are the operator's own, which the admin API cannot change: a
	// runtime rule counts beside the file's winner of its scope, never
	// instead of it (a runtime rule of higher priority, or a more specific
	// path, or the same rule with a lower id, took an address's 3 logins a
	// minute to a million: attack 53).
	var last, lastRuntime, lastTrial, lastRuntimeTrial Scope
	for i := range s.rules {
		r := &s.rules[i]
		won := &last
		switch {
		case r.Action == ActionLogOnly && r.Runtime:
			won = &lastRuntimeTrial // nor a runtime trial the file's (attack 55 F5)
		case r.Action == ActionLogOnly:
			won = &lastTrial
		case r.Runtime:
			won = &lastRuntime
		}
		if r.Scope == *won {
			continue // this scope already has its winner
		}
		if !scopeApplies(r.Scope, req) || !r.matches(req) {
			continue
		}
		dst = append(dst, r)
		*won = r.Scope
	}
	return dst
}

func scopeApplies(s Scope, req Request) bool {
	switch s {
	case ScopeUser:
		return req.IdentityKind == identity.KindUser || req.KeyUser
	case ScopeAPIKey:
		return req.IdentityKind == identity.KindKey
	case ScopeIP:
		return req.IdentityKind == identity.KindIP || req.ClientAddress
	case ScopeTenant:
		return req.Tenant != ""
	}
	return true
}

func (r *Rule) matches(req Request) bool {
	if len(r.Tiers) > 0 && !slices.Contains(r.Tiers, req.Tier) {
		return false
	}
	if len(r.Methods) > 0 && !methodListed(r.Methods, req.Method) && (req.MethodOverride == "" || !methodListed(r.Methods, req.MethodOverride)) {
		return false
	}
	return r.Path == "" || MatchGlob(r.Path, req.Path)
}

// methodListed reports whether a rule's methods select m. A rule on GET
// selects HEAD too: HEAD is GET without the body (RFC 9110, 9.3.2) and
// servers run the GET handler for it, so otherwise HEAD would walk around
// a GET rule at the same cost to the upstream.
func methodListed(methods []string, m string) bool {
	return slices.Contains(methods, m) || m == "HEAD" && slices.Contains(methods, "GET")
}

// Subject is what a rule's scope counts for a caller: the identity's id for
// the typed scopes, the whole canonical identity for "identity", the tenant,
// or "*" for global. keys.NewOwner(string(scope), subject) names the counter.
func Subject(s Scope, identity, identityValue, tenant string) string {
	switch s {
	case ScopeGlobal, ScopeEndpoint:
		return "*"
	case ScopeTenant:
		return tenant
	case ScopeIdentity:
		return identity
	}
	return identityValue
}
