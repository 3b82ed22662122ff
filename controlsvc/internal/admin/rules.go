package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// RuleBody is a rule as the admin API reads it: the seed's fields and ours
// (scope, methods, burst, cost, action, per_endpoint). Pointers tell an
// absent field from a zero, so PUT updates only what it names.
type RuleBody struct {
	TierID          *int     `json:"tier_id"`
	EndpointPattern *string  `json:"endpoint_pattern"`
	Algorithm       *string  `json:"algorithm"`
	Limit           *int64   `json:"limit"`
	WindowSeconds   *int64   `json:"window_seconds"`
	Priority        *int     `json:"priority"`
	IsActive        *bool    `json:"is_active"`
	Scope           *string  `json:"scope"`
	Methods         []string `json:"methods"`
	Burst           *int64   `json:"burst"`
	Cost            *int64   `json:"cost"`
	CostFrom        *string  `json:"cost_from"`
	EstimateFrom    *string  `json:"estimate_from"`
	Reserve         *int64   `json:"reserve"`
	Action          *string  `json:"action"`
	PerEndpoint     *bool    `json:"per_endpoint"`
	// Period ("day", "month"; "" removes it) and TimeZone (IANA; "" is
	// UTC) count a calendar period instead of window_seconds.
	Period   *string `json:"period"`
	TimeZone *string `json:"time_zone"`
	// Response is the rule's own refusal: an object sets it, null removes
	// it, absent keeps it.
	Response json.RawMessage `json:"response"`
}

// RuleView is a rule as the admin API shows it. rule_id is a number for a
// rule made through the API and the file's id (a string) for a rule of the
// config file, which is read-only here.
type RuleView struct {
	RuleID          any             `json:"rule_id"`
	TierID          int             `json:"tier_id,omitempty"`
	TierName        string          `json:"tier_name,omitempty"`
	EndpointPattern string          `json:"endpoint_pattern"`
	Algorithm       string          `json:"algorithm"`
	Limit           int64           `json:"limit"`
	WindowSeconds   int64           `json:"window_seconds"`
	Priority        int             `json:"priority"`
	IsActive        bool            `json:"is_active"`
	Scope           string          `json:"scope"`
	Methods         []string        `json:"methods,omitempty"`
	Burst           int64           `json:"burst,omitempty"`
	Cost            int64           `json:"cost,omitempty"`
	CostFrom        string          `json:"cost_from,omitempty"`
	EstimateFrom    string          `json:"estimate_from,omitempty"`
	Reserve         int64           `json:"reserve,omitempty"`
	Action          string          `json:"action"`
	PerEndpoint     bool            `json:"per_endpoint"`
	Period          string          `json:"period,omitempty"`
	TimeZone        string          `json:"time_zone,omitempty"`
	Response        *rules.Response `json:"response,omitempty"`
	ReadOnly        bool            `json:"read_only"`
	CreatedAt       *time.Time      `json:"created_at,omitempty"`
	UpdatedAt       *time.Time      `json:"updated_at,omitempty"`
}

// RuleList is a page of rules.
type RuleList struct {
	TierID   int        `json:"tier_id,omitempty"`
	TierName string     `json:"tier_name,omitempty"`
	Rules    []RuleView `json:"rules"`
	Total    int        `json:"total"`
}

// Rules lists the live rules, the file's first, optionally only those that
// apply to one tier (rules naming no tier apply to every tier).
func (s *Service) Rules(ctx context.Context, tierID string) (RuleList, error) {
	snap, err := s.load(ctx)
	if err != nil {
		return RuleList{}, err
	}
	p := s.live()
	var out RuleList
	tierName := ""
	if tierID != "" {
		id, err := strconv.Atoi(tierID)
		t := p.TierByID(id)
		if err != nil || t == nil {
			return RuleList{}, apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no tier with that tier_id")
		}
		out.TierID, out.TierName, tierName = t.ID, t.Name, t.Name
	}
	runtime := map[string]ruleset.Rule{}
	for _, r := range snap.Rules {
		runtime[r.ID] = r
	}
	// The policy's configuration holds every rule, the disabled ones too
	// (the compiled set keeps only the enabled).
	for _, r := range p.Rules() {
		if tierName != "" && len(r.Tiers) > 0 && !slices.Contains(r.Tiers, tierName) {
			continue
		}
		if rr, ok := runtime[r.ID]; ok {
			out.Rules = append(out.Rules, viewOf(&rr, p))
			continue
		}
		out.Rules = append(out.Rules, viewOf(&ruleset.Rule{Rule: r}, p))
	}
	if out.Rules == nil {
		out.Rules = []RuleView{}
	}
	out.Total = len(out.Rules)
	return out, nil
}

// Rule returns one rule.
func (s *Service) Rule(ctx context.Context, id string) (RuleView, error) {
	p := s.live()
	for _, r := range p.Rules() {
		if r.ID == id && !runtimeID(id) {
			return viewOf(&ruleset.Rule{Rule: r}, p), nil
		}
	}
	snap, err := s.load(ctx)
	if err != nil {
		return RuleView{}, err
	}
	rr, err := s.runtimeRule(snap, id)
	if err != nil {
		return RuleView{}, err
	}
	return viewOf(rr, p), nil
}

// CreateRule adds a rule. An invalid rule is refused with its field named and
// changes nothing.
func (s *Service) CreateRule(ctx context.Context, body *RuleBody) (RuleView, error) {
	for field, missing := range map[string]bool{"endpoint_pattern": body.EndpointPattern == nil, "limit": body.Limit == nil, "window_seconds": body.WindowSeconds == nil && body.Period == nil} {
		if missing {
			return RuleView{}, apierr.Invalid(field, "is required")
		}
	}
	p := s.live()
	now := s.now().UTC().Truncate(time.Second)
	r := ruleset.Rule{Rule: rules.Rule{Scope: rules.ScopeIdentity, Algorithm: p.DefaultAlgorithm()}, CreatedAt: now, UpdatedAt: now}
	if body.Period != nil && body.Algorithm == nil {
		r.Algorithm = rules.FixedWindow // a calendar period is a fixed window
	}
	if aerr := apply(&r, body, p); aerr != nil {
		return RuleView{}, aerr
	}
	err := s.storeChange(ctx, func(snap ruleset.Snapshot) error {
		// Validate before an id is spent: a refused rule changes nothing.
		if r.ID == "" {
			r.ID = "0"
		}
		if aerr := s.check(append(slices.Clone(snap.Rules), r), snap); aerr != nil {
			return aerr
		}
		if r.ID == "0" {
			n, err := s.rules.NextRuleID(ctx)
			if err != nil {
				return s.unavailable("rules", err)
			}
			r.ID = strconv.FormatInt(n, 10)
		}
		return s.storeErr(s.rules.PutRule(ctx, r, snap.Version))
	})
	if err != nil {
		return RuleView{}, err
	}
	s.log.Info("rule created", "rule_id", r.ID, "endpoint_pattern", r.Path, "limit", r.Limit, "window_seconds", r.WindowSeconds)
	s.changed(ctx)
	v := viewOf(&r, p)
	s.audit(ctx, "rule.create", r.ID, nil, v)
	return v, nil
}

// UpdateRule changes the fields the body names (a partial update).
func (s *Service) UpdateRule(ctx context.Context, id string, body *RuleBody) (RuleView, error) {
	p := s.live()
	var cur, r ruleset.Rule
	err := s.storeChange(ctx, func(snap ruleset.Snapshot) error {
		found, err := s.runtimeRule(snap, id)
		if err != nil {
			return err
		}
		cur, r = *found, *found
		r.Tiers, r.Methods = slices.Clone(r.Tiers), slices.Clone(r.Methods)
		if aerr := apply(&r, body, p); aerr != nil {
			return aerr
		}
		r.UpdatedAt = s.now().UTC().Truncate(time.Second)
		next := slices.Clone(snap.Rules)
		for i := range next {
			if next[i].ID == id {
				next[i] = r
			}
		}
		if aerr := s.check(next, snap); aerr != nil {
			return aerr
		}
		return s.storeErr(s.rules.PutRule(ctx, r, snap.Version))
	})
	if err != nil {
		return RuleView{}, err
	}
	s.log.Info("rule updated", "rule_id", r.ID)
	s.changed(ctx)
	v := viewOf(&r, p)
	s.audit(ctx, "rule.update", r.ID, viewOf(&cur, p), v)
	return v, nil
}

// DeleteRule removes a runtime rule.
func (s *Service) DeleteRule(ctx context.Context, id string) error {
	var cur ruleset.Rule
	err := s.storeChange(ctx, func(snap ruleset.Snapshot) error {
		found, err := s.runtimeRule(snap, id)
		if err != nil {
			return err
		}
		cur = *found
		err = s.rules.DeleteRule(ctx, id, snap.Version)
		if errors.Is(err, ruleset.ErrNotFound) {
			return apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no rule with that rule_id")
		}
		return s.storeErr(err)
	})
	if err != nil {
		return err
	}
	s.log.Info("rule deleted", "rule_id", id)
	s.changed(ctx)
	s.audit(ctx, "rule.delete", id, viewOf(&cur, s.live()), nil)
	return nil
}

// runtimeRule finds a rule the API may change in snap: 409 READ_ONLY for a
// rule of the config file, 404 for none.
func (s *Service) runtimeRule(snap ruleset.Snapshot, id string) (*ruleset.Rule, error) {
	if !runtimeID(id) {
		for _, r := range s.live().Rules() {
			if r.ID == id {
				return nil, apierr.New(apierr.KindConflict, wire.CodeReadOnly, "rule "+strconv.Quote(id)+" comes from the config file; change it there")
			}
		}
		return nil, apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no rule with that rule_id")
	}
	for i := range snap.Rules {
		if snap.Rules[i].ID == id {
			return &snap.Rules[i], nil
		}
	}
	return nil, apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no rule with that rule_id")
}

// maxAttempts bounds how often one change is validated again because
// another change was stored first.
const maxAttempts = 8

// storeChange runs op on a fresh snapshot until the store takes what op
// wrote: when another change came first (ruleset.ErrConflict), op runs again
// on the new state, so what is stored was always validated against what it
// replaces. Under a storm of changes it gives up with 409 CONFLICT.
func (s *Service) storeChange(ctx context.Context, op func(ruleset.Snapshot) error) error {
	for range maxAttempts {
		snap, err := s.load(ctx)
		if err != nil {
			return err
		}
		if err := op(snap); !errors.Is(err, ruleset.ErrConflict) {
			return err
		}
	}
	return apierr.New(apierr.KindConflict, wire.CodeConflict, "the rules kept changing while this change was made; send it again")
}

// storeErr passes a conflict on (storeChange retries it) and reports any
// other store failure as the store being unreachable.
func (s *Service) storeErr(err error) error {
	if err == nil || errors.Is(err, ruleset.ErrConflict) {
		return err
	}
	return s.unavailable("rules", err)
}

var decimal = regexp.MustCompile(`^[1-9][0-9]{0,17}$`)

// runtimeID reports whether id is one the API issues (a decimal number).
func runtimeID(id string) bool { return decimal.MatchString(id) }

// apply sets the fields the body names on r.
func apply(r *ruleset.Rule, b *RuleBody, p *policy.Policy) *apierr.Error {
	if b.TierID != nil {
		r.TierID, r.Tiers = 0, nil
		if *b.TierID != 0 {
			t := p.TierByID(*b.TierID)
			if t == nil {
				return apierr.Invalid("tier_id", fmt.Sprintf("%d is not a tier", *b.TierID))
			}
			r.TierID, r.Tiers = t.ID, []string{t.Name}
		}
	}
	set(&r.Path, b.EndpointPattern)
	if b.Algorithm != nil {
		r.Algorithm = rules.Algorithm(*b.Algorithm)
	}
	set(&r.Limit, b.Limit)
	set(&r.WindowSeconds, b.WindowSeconds)
	set(&r.Priority, b.Priority)
	if b.IsActive != nil {
		active := *b.IsActive
		r.Enabled = &active
	}
	if b.Scope != nil {
		r.Scope = rules.Scope(*b.Scope)
	}
	if b.Methods != nil {
		r.Methods = b.Methods
	}
	set(&r.Burst, b.Burst)
	set(&r.Cost, b.Cost)
	set(&r.CostFrom, b.CostFrom)
	set(&r.EstimateFrom, b.EstimateFrom)
	set(&r.Reserve, b.Reserve)
	if b.Action != nil {
		r.Action = rules.Action(*b.Action)
	}
	set(&r.PerEndpoint, b.PerEndpoint)
	if b.Period != nil {
		r.Period = rules.Period(*b.Period)
		if r.Period != "" && b.WindowSeconds == nil {
			r.WindowSeconds = 0 // a period replaces the window
		}
	}
	set(&r.TimeZone, b.TimeZone)
	if b.Response != nil {
		r.Response = nil
		if string(b.Response) != "null" {
			var resp rules.Response
			// As strict as the body around it: no key in another case,
			// none given twice, none unknown.
			if err := wire.Decode(b.Response, &resp, true); err != nil {
				if fe, ok := fielderr.As(err); ok {
					return apierr.InvalidValue(fe.In("response").Field, fe.Reason)
				}
				return apierr.Invalid("response", err.Error())
			}
			r.Response = &resp
		}
	}
	return nil
}

func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// check validates runtime rules (with the stored tiers) laid over the file.
func (s *Service) check(next []ruleset.Rule, snap ruleset.Snapshot) *apierr.Error {
	after := snap
	after.Rules = next
	return s.checkSnapshot(snap, after)
}

// checkSnapshot validates after, a change to the stored snap.
func (s *Service) checkSnapshot(snap, after ruleset.Snapshot) *apierr.Error {
	err := s.validate(snap, after)
	if err == nil {
		return nil
	}
	fe, ok := fielderr.As(err)
	if !ok {
		return apierr.Invalid("body", err.Error())
	}
	// The policy names a runtime entry's fields as this API does; a field
	// of no one entry (the tier or rule count) is the body's.
	field := fe.Field
	if field == "" {
		field = "body"
	}
	return apierr.InvalidValue(field, fe.Reason)
}

// audit appends an admin change to the trail. The change is made: a trail
// that cannot be written is logged, not failed.
func (s *Service) audit(ctx context.Context, action, target string, before, after any) {
	if err := s.trail.Append(ctx, audit.Change(ctx, s.now(), action, target, before, after)); err != nil {
		s.log.Warn("audit trail not written", "action", action, "err", err)
	}
}

func (s *Service) load(ctx context.Context) (ruleset.Snapshot, error) {
	snap, _, err := s.rules.Load(ctx)
	if err != nil {
		return ruleset.Snapshot{}, s.unavailable("rules", err)
	}
	return snap, nil
}

func (s *Service) unavailable(op string, err error) error {
	s.m.RedisErrors.WithLabelValues(op).Inc()
	return apierr.Unavailable("could not reach the rule store", err)
}

func viewOf(r *ruleset.Rule, p *policy.Policy) RuleView {
	v := RuleView{
		RuleID: r.ID, EndpointPattern: r.Path, Algorithm: string(r.Algorithm), Limit: r.Limit, WindowSeconds: r.WindowSeconds,
		Priority: r.Priority, IsActive: r.IsEnabled(), Scope: string(r.Scope), Methods: r.Methods, Burst: r.Burst, Cost: r.Cost, CostFrom: r.CostFrom, EstimateFrom: r.EstimateFrom, Reserve: r.Reserve,
		Action: string(r.Action), PerEndpoint: r.PerEndpoint, Period: string(r.Period), TimeZone: r.TimeZone, Response: r.Response, ReadOnly: !runtimeID(r.ID),
	}
	if v.Action == "" {
		v.Action = string(rules.ActionReject)
	}
	if n, err := strconv.ParseInt(r.ID, 10, 64); err == nil && runtimeID(r.ID) {
		v.RuleID = n
		v.CreatedAt, v.UpdatedAt = &r.CreatedAt, &r.UpdatedAt
	}
	if len(r.Tiers) == 1 {
		v.TierName = r.Tiers[0]
		if t := p.TierByName(r.Tiers[0]); t != nil {
			v.TierID = t.ID
		}
	}
	return v
}
