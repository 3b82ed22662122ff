package policy

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Policy is a model compiled for deciding. It is immutable: a change
// compiles a new one, which is swapped in whole.
type Policy struct {
	spec      Spec
	rules     *rules.Set
	tiers     map[string]tierRules
	exemptIPs []netip.Prefix
	exemptIDs map[string]bool // canonical identities
	// twins holds a copy of each rule that names paths and counts per
	// path: MatchScript counts a request against the script's path with it
	// where the rule matched the route too (a pointer of its own, stable,
	// so that it can be told from the route's).
	twins map[*rules.Rule]*rules.Rule
}

// Compile builds the policy of a valid model; version names it.
func Compile(spec *Spec, version string) (*Policy, error) {
	set, err := rules.NewSet(version, spec.Rules)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	p := &Policy{spec: *spec, rules: set, tiers: make(map[string]tierRules, len(spec.Tiers)), exemptIDs: map[string]bool{}}
	for i := range spec.Tiers {
		tr, err := compileTier(&spec.Tiers[i], spec.DefaultAlgorithm, version)
		if err != nil {
			return nil, fmt.Errorf("tiers[%d]: %w", i, err)
		}
		p.tiers[spec.Tiers[i].Name] = tr
	}
	p.twins = map[*rules.Rule]*rules.Rule{}
	p.addTwins(p.rules)
	for _, tr := range p.tiers {
		p.addTwins(tr.set)
	}
	for _, s := range spec.Exemptions.IPs {
		pfx, err := ParseIPOrPrefix(s)
		if err != nil {
			return nil, fmt.Errorf("exemption %q: %w", s, err)
		}
		p.exemptIPs = append(p.exemptIPs, pfx)
	}
	for _, u := range spec.Exemptions.Users {
		p.exemptIDs[identity.ID{Kind: identity.KindUser, Value: u}.String()] = true
	}
	for _, k := range spec.Exemptions.Keys {
		p.exemptIDs[identity.ID{Kind: identity.KindKey, Value: k}.String()] = true
	}
	return p, nil
}

// tierRules are a tier compiled: its rules of the identity scope (its
// endpoint limits at priority 1, its default at 0, every path), of which
// one decides per request, and, for a per-endpoint tier, its total: the
// bound per caller across all paths, counted beside whichever decides.
type tierRules struct {
	set     *rules.Set
	total   *rules.Rule
	runtime bool
}

func compileTier(t *Tier, defaultAlgo rules.Algorithm, version string) (tierRules, error) {
	algo := t.Algorithm
	if algo == "" {
		algo = defaultAlgo
	}
	rs := []rules.Rule{{
		ID: "tier_" + t.Name, Scope: rules.ScopeIdentity, Algorithm: algo,
		Limit: t.Limit, WindowSeconds: t.WindowSeconds, Burst: t.Burst, PerEndpoint: t.IsPerEndpoint(),
	}}
	eps := slices.Sorted(maps.Keys(t.Endpoints))
	for _, path := range eps {
		limit := t.Endpoints[path]
		rs = append(rs, rules.Rule{
			ID: endpointRuleID(t.Name, path), Path: path, Scope: rules.ScopeIdentity, Algorithm: algo,
			Limit: limit, WindowSeconds: t.WindowSeconds, Burst: min(t.Burst, limit), Priority: 1, PerEndpoint: true,
		})
	}
	set, err := rules.NewSet(version, rs)
	if err != nil {
		return tierRules{}, err
	}
	tr := tierRules{set: set, runtime: t.Runtime}
	if total := t.Total(); total > 0 {
		// The total's bucket is the total itself: a tier's burst must not
		// lift it (a burst of 1,000 made a total of 100 admit 1,000).
		tr.total = &rules.Rule{ID: "tier_" + t.Name + ".total", Scope: rules.ScopeIdentity, Algorithm: algo,
			Limit: total, WindowSeconds: t.WindowSeconds}
		if err := tr.total.Validate(); err != nil {
			return tierRules{}, err
		}
	}
	return tr, nil
}

// endpointRuleID names a tier's endpoint limit by its path, the rule id
// being part of its counters' keys: named by its place among the tier's
// paths, a limit added on a path that sorts first moved every other onto
// fresh counters (an outsider's API key got 15 logins an hour past a
// limit of 5 over two unrelated tier edits). 64 bits of the path's FNV-1a
// hash: distinct for any two of a tier's 256 paths but by a chance of
// 1 in 2^49.
func endpointRuleID(tier, path string) string {
	h := fnv.New64a()
	h.Write([]byte(path))
	return "tier_" + tier + "_ep_" + strconv.FormatUint(h.Sum64(), 16)
}

// Version names the compiled model.
func (p *Policy) Version() string { return p.rules.Version() }

// Matching returns the enabled configured rules in matching order. Callers
// must not modify them.
func (p *Policy) Matching() []rules.Rule { return p.rules.Rules() }

// Rules returns every configured rule, the disabled ones too, the file's
// first. Callers must not modify them.
func (p *Policy) Rules() []rules.Rule { return p.spec.Rules }

// Tiers returns every tier, the file's first. Callers must not modify them.
func (p *Policy) Tiers() []Tier { return p.spec.Tiers }

// DefaultTier is the tier of callers that name none.
func (p *Policy) DefaultTier() string { return p.spec.DefaultTier }

// DefaultAlgorithm is the algorithm of limits that name none.
func (p *Policy) DefaultAlgorithm() rules.Algorithm { return p.spec.DefaultAlgorithm }

// TierByID returns the tier with that tier_id, or nil.
func (p *Policy) TierByID(id int) *Tier {
	for i := range p.spec.Tiers {
		if p.spec.Tiers[i].ID == id {
			return &p.spec.Tiers[i]
		}
	}
	return nil
}

// TierByName returns the tier of that name, or nil.
func (p *Policy) TierByName(name string) *Tier {
	for i := range p.spec.Tiers {
		if p.spec.Tiers[i].Name == name {
			return &p.spec.Tiers[i]
		}
	}
	return nil
}

// Tier returns the tier a caller naming name is decided in: that tier when
// it is configured, else the default.
func (p *Policy) Tier(name string) string {
	if _, ok := p.tiers[name]; ok {
		return name
	}
	return p.spec.DefaultTier
}

// KeyTier is the tier an API key's checks are decided in: the tier it was
// issued for, found by id (a renamed tier keeps its keys; a new tier taking
// an old name does not inherit them), the default tier once that tier is
// gone. A key issued before ids were kept (tierID 0) is found by its tier's
// name; "" for a key with no tier at all.
func (p *Policy) KeyTier(tierID int, tierName string) string {
	if tierID == 0 {
		if tierName == "" {
			return ""
		}
		return p.Tier(tierName)
	}
	if t := p.TierByID(tierID); t != nil {
		return t.Name
	}
	return p.spec.DefaultTier
}

// KeyRequired reports whether a caller of tier on endpoint must present an
// API key: its tier or the path says so, or the path of the PHP script
// that runs the request (script, from Endpoint; "" for none).
func (p *Policy) KeyRequired(tier, endpoint, script string) bool {
	if t := p.TierByName(tier); t != nil && t.RequireAPIKey {
		return true
	}
	for _, g := range p.spec.APIKeyRequiredPaths {
		if rules.MatchGlob(g, endpoint) || script != "" && rules.MatchGlob(g, script) {
			return true
		}
	}
	return false
}

// Exempt reports whether the caller skips rate limiting; name is
// id.String().
func (p *Policy) Exempt(id identity.ID, name string) bool {
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

// Match appends to dst the rules that apply to req: the configured rules'
// winners, one per scope (and a runtime rule's beside the file's), and the
// caller's tier. The tier always applies unless a rejecting rule of its
// own scope (identity) matched: such a rule replaces the tier's limit for
// that request, explicitly (a runtime rule a runtime tier's only). Rules of other
// scopes (a per-address login limit, a per-user ceiling) count beside the
// tier and never lift it, and a log-only rule replaces nothing. The tier's
// total, for a per-endpoint tier, always counts, even where a rule
// replaced the tier's limit, so walking distinct paths never escapes it.
//
// The rules come in the order they are asked (decide stops at the first
// refusal): the caller's own counters before counters everyone shares, so
// a request the caller's own limits refuse never spends a global, endpoint
// or tenant counter (one client past its limit could otherwise empty a
// limit every caller shares); and among each, a counter across paths
// before a counter per path, so a refused request creates no per-path key
// (what one caller makes Redis hold stays bounded by its total).
func (p *Policy) Match(dst []*rules.Rule, req rules.Request) []*rules.Rule {
	n := len(dst)
	dst = p.rules.Match(dst, req)
	t := p.tiers[req.Tier]
	replaced := false
	for _, r := range dst[n:] {
		// A runtime rule replaces no tier of the config file: the file's
		// limits are the operator's own, which the admin API cannot lift
		// (a runtime rule beside it counts beside it).
		if r.Scope == rules.ScopeIdentity && r.Action != rules.ActionLogOnly && (!r.Runtime || t.runtime) {
			replaced = true
		}
	}
	if t.total != nil {
		dst = append(dst, t.total)
	}
	if !replaced {
		dst = t.set.Match(dst, req)
	}
	slices.SortStableFunc(dst[n:], func(a, b *rules.Rule) int { return cmp.Compare(askOrder(a), askOrder(b)) })
	return dst
}

// MatchScript is Match for a request that a PHP script runs with path
// info (script, paths.ScriptPath: "/login.php/x" runs "/login.php"; the
// route in req.Path is the path info, paths.FoldScript). Whether the
// server runs the script as a front controller routing its path info or
// as a script of its own is the server's configuration, so both count:
// the route's rules, and beside them the rules naming paths that match the
// script: those the route's did not match, and those that count per path
// (as their twin: one counter the route's, another the script's, or a
// "/**" rule of one counter per path counted "/upload.php/{i}" as a fresh
// path each time). viaScript are these, counted against the script's path.
// Rules that name no path (a tier's default) count once, against the
// route: a front controller's callers spelling "/index.php/..." do not
// share one counter for all its routes.
func (p *Policy) MatchScript(dst []*rules.Rule, req rules.Request, script string) (matched, viaScript []*rules.Rule) {
	n := len(dst)
	dst = p.Match(dst, req)
	if script == "" {
		return dst, nil
	}
	req.Path = script
	var buf [6]*rules.Rule
	for _, r := range p.Match(buf[:0], req) {
		if r.Path == "" {
			continue
		}
		if slices.Contains(dst[n:], r) {
			if r = p.twins[r]; r == nil {
				continue // one counter across paths: counted already
			}
		}
		dst = append(dst, r)
		viaScript = append(viaScript, r)
	}
	if viaScript != nil {
		slices.SortStableFunc(dst[n:], func(a, b *rules.Rule) int { return cmp.Compare(askOrder(a), askOrder(b)) })
	}
	return dst, viaScript
}

func (p *Policy) addTwins(s *rules.Set) {
	rs := s.Rules()
	for i := range rs {
		if r := &rs[i]; r.Path != "" && r.CountsPerEndpoint() {
			twin := *r
			p.twins[r] = &twin
		}
	}
}

// askOrder ranks a rule for asking: the caller's own counters first, across
// paths before per path, then shared ones.
func askOrder(r *rules.Rule) int {
	o := 0
	if r.Scope.Shared() {
		o += 2
	}
	if r.CountsPerEndpoint() {
		o++
	}
	return o
}

// Endpoint normalises a request's path (shared/paths, as the filter does),
// drops a PHP script segment that path info follows (paths.FoldScript),
// and folds its case and its aliases when path_case and path_aliases say
// the upstream does: one resource is one counter however it is spelled. The filter does not fold: its lease
// buckets stay per spelling, each spending from the one folded counter.
// Beside that route it returns the path of the PHP script that runs the
// request with path info ("" when none runs it so; MatchScript counts the
// request against both), folded the same way.
func (p *Policy) Endpoint(ep string) (route, script string, err error) {
	if ep == "" {
		return "", "", fielderr.New("", "is required")
	}
	// paths.MaxLen bounds it, the same bound the filter applies: a path
	// the filter takes is never refused here.
	n, err := paths.Normalize(ep)
	if err != nil {
		return n, "", err
	}
	// A PHP front controller's path info is the route (always).
	route, script = p.fold(paths.FoldScript(n)), paths.ScriptPath(n)
	if script != "" {
		script = p.fold(script)
	}
	if script == route {
		// "/report.php/report.php": one path, counted once (twice, a
		// per-path rule's counter took two tokens a request).
		script = ""
	}
	return route, script, nil
}

// fold folds a normalised path's case and aliases where path_case and
// path_aliases say the upstream does.
func (p *Policy) fold(n string) string {
	if p.spec.PathCase == PathCaseInsensitive {
		n = paths.FoldCase(n)
	}
	if p.spec.PathAliases == PathAliasesFold {
		n = paths.FoldSuffix(n)
	}
	return n
}
