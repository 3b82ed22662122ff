// Package decision answers rate-limit checks: it validates the request,
// resolves the caller, picks the rules that apply and runs them through the
// limiter, applying exemptions, penalties and the failure mode.
package decision

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Policy is a configuration compiled for deciding. It is immutable; a reload
// builds a new one and swaps it in.
type Policy struct {
	Config    *config.Config
	Rules     *rules.Set
	tiers     map[string]*rules.Set
	exemptIPs []netip.Prefix
	exemptIDs map[string]bool // canonical identities
	penalty   *limiter.Penalty
	// decisionDigests are the SHA-256 of the decision tokens, computed once:
	// the decision route compares against them on every request.
	decisionDigests [][sha256.Size]byte
}

// DecisionTokenDigests returns the digests of the accepted decision tokens
// (none: the decision API takes uncredentialed callers, plain shape only).
func (p *Policy) DecisionTokenDigests() [][sha256.Size]byte { return p.decisionDigests }

// Compile builds a policy. cfg must have passed Validate.
func Compile(cfg *config.Config, version string) (*Policy, error) {
	set, err := rules.NewSet(version, cfg.Rules)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	p := &Policy{Config: cfg, Rules: set, tiers: make(map[string]*rules.Set, len(cfg.Tiers)), exemptIDs: map[string]bool{}}
	for i := range cfg.Tiers {
		t := &cfg.Tiers[i]
		ts, err := rules.NewSet(version, tierRules(t, cfg.DefaultAlgorithm))
		if err != nil {
			return nil, fmt.Errorf("tiers[%d]: %w", i, err)
		}
		p.tiers[t.Name] = ts
	}
	for _, s := range cfg.Exemptions.IPs {
		pfx, err := config.ParseIPOrPrefix(s)
		if err != nil {
			return nil, fmt.Errorf("exemption %q: %w", s, err)
		}
		p.exemptIPs = append(p.exemptIPs, pfx)
	}
	for _, u := range cfg.Exemptions.Users {
		p.exemptIDs[identity.ID{Kind: identity.KindUser, Value: u}.String()] = true
	}
	for _, k := range cfg.Exemptions.Keys {
		p.exemptIDs[identity.ID{Kind: identity.KindKey, Value: k}.String()] = true
	}
	for _, t := range cfg.DecisionTokens() {
		p.decisionDigests = append(p.decisionDigests, sha256.Sum256([]byte(t)))
	}
	if pc := cfg.Penalties; pc.Enabled {
		p.penalty = &limiter.Penalty{
			Window:      time.Duration(pc.DetectionWindowSeconds) * time.Second,
			Threshold:   pc.ViolationThreshold,
			Multipliers: pc.Multipliers,
		}
	}
	return p, nil
}

// tierRules turns a tier into rules of the identity scope: its endpoint
// overrides (priority 1) and its default (priority 0, every path). Tier rules
// apply only when no configured rule matches.
func tierRules(t *config.Tier, defaultAlgo rules.Algorithm) []rules.Rule {
	algo := t.Algorithm
	if algo == "" {
		algo = defaultAlgo
	}
	perEndpoint := t.PerEndpoint == nil || *t.PerEndpoint
	out := []rules.Rule{{
		ID: "tier_" + t.Name, Scope: rules.ScopeIdentity, Algorithm: algo,
		Limit: t.Limit, WindowSeconds: t.WindowSeconds, Burst: t.Burst, PerEndpoint: perEndpoint,
	}}
	paths := make([]string, 0, len(t.Endpoints))
	for p := range t.Endpoints {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for i, path := range paths {
		limit := t.Endpoints[path]
		out = append(out, rules.Rule{
			ID: "tier_" + t.Name + "_ep" + strconv.Itoa(i), Path: path, Scope: rules.ScopeIdentity, Algorithm: algo,
			Limit: limit, WindowSeconds: t.WindowSeconds, Burst: min(t.Burst, limit), Priority: 1, PerEndpoint: true,
		})
	}
	return out
}

// tier returns the tier to use: the caller's when configured, else the default.
func (p *Policy) tier(name string) string {
	if _, ok := p.tiers[name]; ok {
		return name
	}
	return p.Config.DefaultTier
}

// KeyTier is the tier an API key's checks are decided in: the tier it was
// issued for, found by id (a renamed tier keeps its keys; a new tier taking
// an old name does not inherit them), the default tier once that tier is
// gone. A key issued before ids were kept is found by its tier's name; ""
// for a key with no tier at all.
func (p *Policy) KeyTier(rec *apikeys.Record) string {
	if rec.TierID == 0 {
		if rec.Tier == "" {
			return ""
		}
		return p.tier(rec.Tier)
	}
	for i := range p.Config.Tiers {
		if p.Config.Tiers[i].ID == rec.TierID {
			return p.Config.Tiers[i].Name
		}
	}
	return p.Config.DefaultTier
}

// keyRequired reports whether a caller of tier on endpoint must present an
// API key: its tier or the path says so.
func (p *Policy) keyRequired(tier, endpoint string) bool {
	for i := range p.Config.Tiers {
		if t := &p.Config.Tiers[i]; t.Name == tier && t.RequireAPIKey {
			return true
		}
	}
	for _, g := range p.Config.APIKeyRequiredPaths {
		if rules.MatchGlob(g, endpoint) {
			return true
		}
	}
	return false
}

// exempt reports whether the caller skips rate limiting; name is
// id.String().
func (p *Policy) exempt(id identity.ID, name string) bool {
	if id.Kind == identity.KindIP && len(p.exemptIPs) > 0 {
		a, err := netip.ParseAddr(id.Value)
		if err == nil {
			for _, pfx := range p.exemptIPs {
				if pfx.Contains(a) {
					return true
				}
			}
		}
		return false
	}
	return p.exemptIDs[name]
}

// match returns the rules that apply: the configured rules' winners, or the
// tier's when none matches.
func (p *Policy) match(dst []*rules.Rule, req rules.Request) []*rules.Rule {
	n := len(dst)
	dst = p.Rules.Match(dst, req)
	if len(dst) > n {
		return dst
	}
	return p.tiers[req.Tier].Match(dst, req)
}
