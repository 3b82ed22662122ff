package admin

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// TierBody is a tier as PUT /admin/v1/tiers/{tier_id} reads it: the whole
// tier (the id is the path's).
type TierBody struct {
	Name          string           `json:"name"`
	Limit         int64            `json:"limit"`
	WindowSeconds int64            `json:"window_seconds"`
	Algorithm     string           `json:"algorithm"`
	Burst         int64            `json:"burst"`
	PerEndpoint   *bool            `json:"per_endpoint"`
	TotalLimit    int64            `json:"total_limit"`
	Endpoints     map[string]int64 `json:"endpoints"`
	Description   string           `json:"description"`
	// RequireAPIKey refuses callers of the tier without an API key.
	RequireAPIKey bool `json:"require_api_key"`
}

// TierView is a tier as the admin API shows it; a tier of the config file is
// read-only here.
type TierView struct {
	policy.Tier
	ReadOnly  bool       `json:"read_only"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

// TierList is every tier.
type TierList struct {
	Tiers       []TierView `json:"tiers"`
	DefaultTier string     `json:"default_tier"`
	Total       int        `json:"total"`
}

// Tiers lists every live tier, the file's first.
func (s *Service) Tiers(ctx context.Context) (TierList, error) {
	snap, err := s.load(ctx)
	if err != nil {
		return TierList{}, err
	}
	p := s.live()
	out := TierList{DefaultTier: p.DefaultTier(), Tiers: []TierView{}}
	for _, t := range p.Tiers() {
		v := TierView{Tier: t, ReadOnly: true}
		if i := slices.IndexFunc(snap.Tiers, func(r ruleset.Tier) bool { return r.ID == t.ID }); i >= 0 {
			v.ReadOnly, v.UpdatedAt = false, &snap.Tiers[i].UpdatedAt
		}
		out.Tiers = append(out.Tiers, v)
	}
	out.Total = len(out.Tiers)
	return out, nil
}

// PutTier creates or replaces a runtime tier. A tier of the config file is
// refused (409 READ_ONLY); an invalid tier is refused with its field named
// and changes nothing.
func (s *Service) PutTier(ctx context.Context, rawID string, body *TierBody) (TierView, error) {
	id, err := strconv.Atoi(rawID)
	if err == nil && strconv.Itoa(id) != rawID {
		// "03" or "+3" is no tier id: one tier, one spelling.
		err = strconv.ErrSyntax
	}
	if err != nil || id < 1 || id > 1_000_000 {
		return TierView{}, apierr.Invalid("tier_id", "must be a number in 1..1000000")
	}
	t := ruleset.Tier{Tier: policy.Tier{ID: id, Name: body.Name, Limit: body.Limit, WindowSeconds: body.WindowSeconds,
		Algorithm: rules.Algorithm(body.Algorithm), Burst: body.Burst, PerEndpoint: body.PerEndpoint, TotalLimit: body.TotalLimit, Endpoints: body.Endpoints,
		Description: body.Description, RequireAPIKey: body.RequireAPIKey}, UpdatedAt: s.now().UTC().Truncate(time.Second)}
	var before any
	err = s.storeChange(ctx, func(snap ruleset.Snapshot) error {
		before = nil
		runtime := slices.IndexFunc(snap.Tiers, func(t ruleset.Tier) bool { return t.ID == id })
		if t := s.live().TierByID(id); t != nil && runtime < 0 {
			return apierr.New(apierr.KindConflict, wire.CodeReadOnly, "tier "+strconv.Itoa(id)+" comes from the config file; change it there")
		}
		next := slices.Clone(snap.Tiers)
		if runtime >= 0 {
			before = snap.Tiers[runtime].Tier
			next[runtime] = t
		} else {
			next = append(next, t)
		}
		cand := snap
		cand.Tiers = next
		if aerr := s.checkSnapshot(snap, cand); aerr != nil {
			return aerr
		}
		return s.storeErr(s.rules.PutTier(ctx, t, snap.Version))
	})
	if err != nil {
		return TierView{}, err
	}
	s.log.Info("tier stored", "tier_id", id, "name", t.Name, "limit", t.Limit, "window_seconds", t.WindowSeconds)
	s.changed(ctx)
	v := TierView{Tier: t.Tier, UpdatedAt: &t.UpdatedAt}
	s.audit(ctx, "tier.put", strconv.Itoa(id), before, v.Tier)
	return v, nil
}
