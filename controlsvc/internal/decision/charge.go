package decision

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// charges lists the rules of an admitted request that take the rest of its
// cost from the response, for the caller to read there and charge.
func charges(rs []applied) []wire.Charge {
	var out []wire.Charge
	for _, a := range rs {
		r := a.req.Rule
		if src, _ := rules.CostSourceOf(r.CostFrom); src.AfterResponse() {
			ch := wire.Charge{RuleID: r.ID, CostFrom: r.CostFrom} // at most wire.MaxCharges: rules.NewSet
			if a.res.Reserved > 0 {
				ch.Reserved, ch.ReservedAt = a.res.Reserved, a.res.WindowStart
			}
			out = append(out, ch)
		}
	}
	return out
}

// chargeLease finds the rule whose tokens a lease may hold as a second pool
// (wire.Lease.ChargeGranted), and how many to ask of it: a request counted
// by one rule whose cost the response reports (an LLM token budget) and
// otherwise by rules of fixed costs (its tier's request limits) can be
// admitted on a lease when the filter reads the response of every request
// it admits so and pays the response's cost from that pool first (it says
// so with lease_charges). The filter asks for a number of requests; a
// request's worth of the rule's tokens is its cost for an unreported
// answer (its capacity unless set), and the script grants no more than the
// lease fraction of what is left. No pool (-1) under two such rules, a
// rule whose cost the request gives, or a rule whose admission needs an
// estimate left or holds a reserve: the filter does not read those on a
// lease hit, and a request admitted on a lease would hold nothing.
func chargeLease(rs []applied, c *caller) (pool int, want int64) {
	if !c.leaseCharges || c.lease <= 0 {
		return -1, 0
	}
	if pool = chargePool(rs); pool < 0 {
		return -1, 0
	}
	per := rs[pool].req.Rule.UnreportedCost()
	if c.lease > MaxReturned/per {
		return pool, MaxReturned
	}
	return pool, c.lease * per
}

// chargePool is the index of the one rule among rs whose cost a response
// reports and that a lease can pay (chargeLease), -1 when there is none.
func chargePool(rs []applied) int {
	pool := -1
	for i := range rs {
		r := rs[i].req.Rule
		if r.CostFrom == "" {
			continue
		}
		if src, _ := rules.CostSourceOf(r.CostFrom); !src.AfterResponse() || r.EstimateFrom != "" || r.Reserve > 1 || pool >= 0 {
			return -1
		}
		pool = i
	}
	return pool
}

// unreportedReasons are the reasons a charge may give for a missing cost.
var unreportedReasons = []string{wire.UnreportedMissing, wire.UnreportedInvalid, wire.UnreportedMalformed,
	wire.UnreportedEncoded, wire.UnreportedTooLarge, wire.UnreportedCut, wire.UnreportedError}

// Charge spends what the responses of admitted requests cost beyond their
// admission (cost_from response_*): the reported cost less the 1 the check
// spent, or the rule's unreported cost when the response reported none.
// It never refuses (the request was served); a charge may take a counter
// below zero, to minus a hundred capacities at most, and the caller is refused
// until it refills. Only the decision credential's holder may charge: a
// charge spends up to a hundred capacities of a caller it names.
func (s *Service) Charge(ctx context.Context, req *wire.ChargeRequest, trust Trust) (wire.ChargeResponse, error) {
	if trust != Trusted {
		return wire.ChargeResponse{}, apierr.ForbiddenBecause("charges", "charging a response's cost needs the decision API's service credential")
	}
	p := s.live.Load()
	switch {
	case len(req.Charges) == 0:
		return wire.ChargeResponse{}, apierr.Invalid("charges", "must not be empty")
	case len(req.Charges) > wire.MaxCharges:
		return wire.ChargeResponse{}, apierr.Invalid("charges", fmt.Sprintf("at most %d charges", wire.MaxCharges))
	}
	for i, ch := range req.Charges {
		field := fmt.Sprintf("charges[%d]", i)
		switch {
		case ch.RuleID == "":
			return wire.ChargeResponse{}, apierr.Invalid(field+".rule_id", "is required")
		case ch.Cost != nil && (*ch.Cost < 0 || *ch.Cost > rules.MaxQuantity):
			return wire.ChargeResponse{}, apierr.Invalid(field+".cost", fmt.Sprintf("must be in 0..%d", int64(rules.MaxQuantity)))
		case ch.Cost != nil && ch.Unreported != "":
			return wire.ChargeResponse{}, apierr.Invalid(field+".unreported", "is given beside cost: a response reported its cost or did not")
		case ch.Cost == nil && !slices.Contains(unreportedReasons, ch.Unreported):
			return wire.ChargeResponse{}, apierr.Invalid(field+".unreported", fmt.Sprintf("%q: without cost, one of %v says why", clip(ch.Unreported, 32), unreportedReasons))
		case ch.AtLeast != 0 && ch.Unreported != wire.UnreportedCut:
			return wire.ChargeResponse{}, apierr.Invalid(field+".at_least", "is what a cut stream reported before it was cut: only beside unreported \"cut\"")
		case ch.AtLeast < 0 || ch.AtLeast > rules.MaxQuantity:
			return wire.ChargeResponse{}, apierr.Invalid(field+".at_least", fmt.Sprintf("must be in 0..%d", int64(rules.MaxQuantity)))
		case ch.Reserved < 0 || ch.Reserved > rules.MaxQuantity:
			return wire.ChargeResponse{}, apierr.Invalid(field+".reserved", fmt.Sprintf("must be in 0..%d", int64(rules.MaxQuantity)))
		case ch.Reserved > 0 && ch.ReservedAt <= 0:
			return wire.ChargeResponse{}, apierr.Invalid(field+".reserved_at", "is required beside reserved: it names the stretch the reserve came from")
		case slices.ContainsFunc(req.Charges[:i], func(o wire.ChargeItem) bool { return o.RuleID == ch.RuleID }):
			// One response, one cost a rule: a rule charged twice would
			// hand its reserve back twice (attack 58 F9).
			return wire.ChargeResponse{}, apierr.Invalid(field+".rule_id", "is charged twice")
		}
	}
	t, aerr := p.target(&subject{userID: req.UserID, endpoint: req.Endpoint, method: req.Method, methodOverride: req.MethodOverride,
		tier: req.Tier, tenant: req.Tenant, address: req.ClientAddress}, trust)
	if aerr != nil {
		return wire.ChargeResponse{}, aerr
	}
	c := &caller{target: t, cost: 1}
	if req.APIKey != "" {
		// The key names the counters as it did for the check: its id, its
		// tier, its user (a key revoked or expired since still pays; one
		// not found or malformed is refused).
		if err := s.resolveKey(ctx, p, c, req.APIKey, req.Tier, true); err != nil {
			var ae *apierr.Error
			if errors.As(err, &ae) || p.FailureMode == config.FailClosed {
				return wire.ChargeResponse{}, err
			}
			// Redis down under fail_open: the check decided the request
			// as the caller the filter presented, the key unverified
			// (checkValid), and the charge is that caller's too. Refused,
			// the charge was lost and a well-formed key made each
			// answer cost its admission only (an outsider's: 50 answers,
			// 20,000 tokens, against a budget of 1,500).
		}
	}
	out := wire.ChargeResponse{Results: make([]wire.ChargeResult, len(req.Charges))}
	if p.Disabled || p.Exempt(c.id, c.name) {
		for i, ch := range req.Charges {
			out.Results[i] = wire.ChargeResult{RuleID: ch.RuleID, Error: "not counted: the caller is exempt or rate limiting is off"}
		}
		return out, nil
	}
	rs := s.selectRules(p, &c.target, nil)
	now := s.now()
	var spent int64
	for i, ch := range req.Charges {
		res := &out.Results[i]
		res.RuleID = ch.RuleID
		a := chargedRule(rs, ch.RuleID)
		if a == nil {
			res.Error = "rule " + clip(ch.RuleID, 64) + " takes no cost from the response of this request"
			continue
		}
		r := a.req.Rule
		// The admission spent 1 and held reserved more (at most what the
		// rule can hold, its capacity less the 1, whatever it holds now:
		// a reserve lowered since must not charge a request twice, attack
		// 58 F6; the scripts credit no more than their stretch holds).
		held := min(ch.Reserved, r.Capacity()-1)
		// An answer that reports nothing costs at least what it held: it
		// may have used all of it (a cost below the reserve handed the
		// rest back: 24,576 tokens against 10,000, attack 58 F5).
		total := max(r.UnreportedCost(), held+1)
		switch {
		case ch.Cost != nil:
			total = *ch.Cost
		case ch.Unreported == wire.UnreportedError:
			total = 1 // the admission's
			s.m.ChargesUnreported.WithLabelValues(ch.Unreported).Inc()
		default:
			// A cut stream costs at least what it reported before it was
			// cut (attack 63 S1: 10,401 tokens read, 1,000 charged).
			total = max(total, ch.AtLeast)
			s.m.ChargesUnreported.WithLabelValues(ch.Unreported).Inc()
		}
		// A response that used less than was held hands the rest back
		// to the stretch it came from; one that used more is charged the
		// rest. Either way the whole reserve leaves what the counter
		// holds in flight: what came back, and what the response used
		// (Release).
		lr := a.req
		lr.Cost, lr.Charge = max(total-1-held, 0), true
		var got limiter.Result
		var err error
		back := max(min(held, 1+held-total), 0)
		if held > 0 {
			lr.Release, lr.LeasedAt = held-back, ch.ReservedAt
		}
		if back > 0 {
			// Redis alone takes a hand-back (the stretch it names is its
			// own): during an outage it is lost, never counted in memory
			// as an admission (attack 58 F7).
			lr.Cost, lr.Charge, lr.Returned = 0, false, back
			got, err = s.limit(ctx, lr)
		} else {
			got, _, err = s.limitOrLocal(ctx, p, lr)
		}
		// What the response cost beyond its admission: the part of the
		// reserve it used, and what was charged.
		fromReserve := min(max(total-1, 0), held)
		if err != nil {
			// What the response used of its reserve was spent at its
			// admission: still the caller's usage. A reserve not handed
			// back stays spent (under-admission only).
			res.Error = "not charged: the rate limiter is unavailable"
			if back > 0 {
				res.Error = "not handed back: the rate limiter is unavailable"
			}
			s.log.Warn("charge lost", "rule", r.ID, "identity", c.name, "cost", lr.Cost, "back", back, "err", err)
			spent = max(spent, fromReserve)
			continue
		}
		res.Charged, res.Clamped = fromReserve+got.Charged, lr.Cost-got.Charged
		res.Limit, res.Remaining, res.ResetAt = r.Capacity(), got.Remaining, ceilUnix(now.Add(got.ResetAfter))
		res.Strategy, res.WindowSeconds = string(r.Algorithm), r.WindowSeconds
		if a.req.Origin > 0 {
			res.ResetAt = a.req.Origin/1000 + r.WindowSeconds
		}
		s.m.ChargedTokens.WithLabelValues(r.ID).Add(float64(res.Charged))
		spent = max(spent, res.Charged)
	}
	if spent > 0 {
		// Usage counts what the caller spent: the tokens of these rules
		// (the admission recorded its 1). Rules charged together counted
		// the same request: the most any of them took.
		s.usage.Record(c.name, now, spent, nil)
	}
	return out, nil
}

// chargedRule finds the applied rule id that takes its cost from the
// response.
func chargedRule(rs []applied, id string) *applied {
	for i := range rs {
		r := rs[i].req.Rule
		if src, _ := rules.CostSourceOf(r.CostFrom); r.ID == id && src.AfterResponse() {
			return &rs[i]
		}
	}
	return nil
}
