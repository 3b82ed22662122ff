// Package policy is the control service's rule model: tiers, rules,
// exemptions and the paths that need an API key. It validates a model as a
// whole, composes the entries of every source (the config file, the admin
// API) into one, and compiles it into the Policy that decisions read.
//
// Who imports whom: config loads a file into a Spec; decision and admin read
// the compiled Policy, as peers; the stores keep runtime entries; app wires
// them. This package imports none of them.
package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Path case: whether "/API/Items" and "/api/items" are one resource. Set
// insensitive for an upstream that routes paths case-insensitively
// (Express's default, ASP.NET, IIS): counted apart, a client would get a
// fresh counter per spelling.
const (
	PathCaseSensitive   = "sensitive"
	PathCaseInsensitive = "insensitive"
)

// Path aliases: whether "/login.json", "/login." and "/login%20" are
// "/login". Set fold for an upstream that routes them to one handler
// (Rails' format suffix, Spring's suffix matching, IIS dropping trailing
// dots and spaces): kept apart, each would be a fresh counter.
const (
	PathAliasesKeep = "keep"
	PathAliasesFold = "fold"
)

// Spec is a rule model as its sources state it: the config file's section,
// or the file's entries and the runtime ones composed (Compose).
type Spec struct {
	// PathCase is PathCaseSensitive or PathCaseInsensitive.
	PathCase string `toml:"path_case"`
	// PathAliases is PathAliasesKeep or PathAliasesFold.
	PathAliases      string          `toml:"path_aliases"`
	DefaultTier      string          `toml:"default_tier"`
	DefaultAlgorithm rules.Algorithm `toml:"default_algorithm"`
	Exemptions       Exemptions      `toml:"exemptions"`
	Tiers            []Tier          `toml:"tiers"`
	// APIKeyRequiredPaths are path globs whose callers must present an API
	// key (401 MISSING_API_KEY without one).
	APIKeyRequiredPaths []string     `toml:"api_key_required_paths"`
	Rules               []rules.Rule `toml:"rules"`
}

// Exemptions skip rate limiting entirely.
type Exemptions struct {
	// IPs holds addresses and CIDR prefixes.
	IPs   []string `toml:"ips"`
	Users []string `toml:"users"`
	Keys  []string `toml:"keys"`
}

// Tier is a named quota for callers without a matching rule.
type Tier struct {
	// ID is the tier's number in the admin API (tier_id); a file tier
	// without one gets its position, 1-based.
	ID            int             `json:"tier_id" toml:"id"`
	Name          string          `json:"name" toml:"name"`
	Limit         int64           `json:"limit" toml:"limit"`
	WindowSeconds int64           `json:"window_seconds" toml:"window_seconds"`
	Algorithm     rules.Algorithm `json:"algorithm,omitempty" toml:"algorithm"`
	Burst         int64           `json:"burst,omitempty" toml:"burst"`
	// PerEndpoint counts each path separately (default true).
	PerEndpoint *bool `json:"per_endpoint,omitempty" toml:"per_endpoint"`
	// TotalLimit bounds what one caller of a per-endpoint tier spends across
	// all paths in the window (0: DefaultTotalFactor times Limit), so that
	// walking distinct paths never escapes the tier.
	TotalLimit int64 `json:"total_limit,omitempty" toml:"total_limit"`
	// Endpoints are per-path overrides: path (or glob) → limit in the window.
	Endpoints   map[string]int64 `json:"endpoints,omitempty" toml:"endpoints"`
	Description string           `json:"description,omitempty" toml:"description"`
	// RequireAPIKey refuses callers of this tier without an API key (401
	// MISSING_API_KEY).
	RequireAPIKey bool `json:"require_api_key,omitempty" toml:"require_api_key"`
	// Runtime marks a tier made through the admin API (never stored: set
	// as the runtime tiers are laid over the file's). Only a rule of its
	// own kind replaces its limit (Policy.Match).
	Runtime bool `json:"-" toml:"-"`
}

// Bounds on what a model holds (the file's and the runtime's together):
// every check walks the rules of its scopes, and a policy is compiled on
// every change.
const (
	MaxRules         = 1000
	MaxTiers         = 256
	MaxTierEndpoints = 256
	// MaxDescriptionLen bounds a tier's description: it is stored in the
	// shared rule set and sent in every listing.
	MaxDescriptionLen = 256
	// MaxQuestionPatternBytes bounds the bytes of the rules' patterns that
	// hold a '?', together: a '?' chunk is found by a walk of the path
	// segment that costs its length over 64 (rules.MatchGlob), and every
	// check tries every rule of its scopes. Each pattern bounded alone,
	// 998 patterns of 1 KB cost 150 ms a check of an 8 KB path (attack
	// 53, from an operator's rules); 16 KB of them cost about 4 ms.
	MaxQuestionPatternBytes = 16 << 10
)

// Validate checks a model whose entries all come from the config file, and
// returns a *fielderr.Error naming the first bad field as the file does
// ("rules[2].path").
func (s *Spec) Validate() error {
	return s.validate(names{fileTiers: len(s.Tiers), fileRules: len(s.Rules)})
}

// names spells a field of a model's entry as the entry's source does: the
// first fileTiers tiers and fileRules rules come from the config file and
// are named by their path in it; the rest come from the admin API, which
// reads one entry a request, and are named by the API's field names.
type names struct{ fileTiers, fileRules int }

// tier names field of tier i; apiField is the admin API's name for it.
func (n names) tier(i int, field, apiField string) string {
	if i < n.fileTiers {
		return join(fmt.Sprintf("tiers[%d]", i), field)
	}
	return apiField
}

// rule names field of rule i.
func (n names) rule(i int, field, apiField string) string {
	if i < n.fileRules {
		return join(fmt.Sprintf("rules[%d]", i), field)
	}
	return apiField
}

// ruleNames are rules.Names for rule i.
func (n names) ruleNames(i int) rules.Names {
	if i < n.fileRules {
		return rules.FileNames
	}
	return APIRuleNames
}

// APIRuleNames are the admin API's names of a rule's fields.
var APIRuleNames = rules.Names{ID: "rule_id", Path: "endpoint_pattern", Tiers: "tier_id", Tier: func(int) string { return "tier_id" }}

func join(parent, field string) string {
	switch {
	case field == "":
		return parent
	case strings.HasPrefix(field, "["):
		return parent + field
	}
	return parent + "." + field
}

func (s *Spec) validate(n names) error {
	if err := s.Exemptions.validate(); err != nil {
		return err
	}
	if err := s.validateTiers(n); err != nil {
		return err
	}
	tierNames := s.tierNames()
	if !slices.Contains(tierNames, s.DefaultTier) {
		return fielderr.New("default_tier", "%q is not a configured tier (have %s)", s.DefaultTier, strings.Join(tierNames, ", "))
	}
	if err := s.validateRules(n, tierNames); err != nil {
		return err
	}
	// A check tries the rules and its tier's endpoint limits: their
	// patterns holding a '?' together stay within the bound.
	rulesQ := 0
	for i := range s.Rules {
		if rulesQ += questionBytes(s.Rules[i].Path); rulesQ > MaxQuestionPatternBytes {
			return fielderr.New(n.rule(i, "path", "endpoint_pattern"), "with this pattern the rules' patterns holding a '?' pass %d bytes together (each is tried on every check)", MaxQuestionPatternBytes)
		}
	}
	for i := range s.Tiers {
		q := rulesQ
		for _, p := range slices.Sorted(maps.Keys(s.Tiers[i].Endpoints)) {
			if q += questionBytes(p); q > MaxQuestionPatternBytes {
				return fielderr.New(n.tier(i, fmt.Sprintf("endpoints[%q]", p), fmt.Sprintf("endpoints[%q]", p)),
					"with this pattern the rules' and the tier's patterns holding a '?' pass %d bytes together (each is tried on every check)", MaxQuestionPatternBytes)
			}
		}
	}
	for i, p := range s.APIKeyRequiredPaths {
		if err := rules.ValidateGlob(p); err != nil {
			return fielderr.New(fmt.Sprintf("api_key_required_paths[%d]", i), "%v", err)
		}
	}
	if err := s.validatePathSpelling(n, true, "a PHP script segment before more path", "", "", paths.FoldScript); err != nil {
		return err
	}
	if err := s.validatePathSpelling(n, s.PathCase == PathCaseInsensitive, "upper-case letters", "path_case", PathCaseInsensitive, paths.FoldCase); err != nil {
		return err
	}
	return s.validatePathSpelling(n, s.PathAliases == PathAliasesFold, "a suffix or trailing dots or spaces", "path_aliases", PathAliasesFold, paths.FoldSuffix)
}

func (s *Spec) validateRules(n names, tierNames []string) error {
	if len(s.Rules) > MaxRules {
		return fielderr.New("rules", "at most %d rules", MaxRules)
	}
	seen := make(map[string]int, len(s.Rules))
	for i := range s.Rules {
		r := &s.Rules[i]
		if err := r.ValidateAs(n.ruleNames(i)); err != nil {
			if fe, ok := fielderr.As(err); ok && i < n.fileRules {
				return fe.In(fmt.Sprintf("rules[%d]", i))
			}
			return err
		}
		if r.Period != "" {
			if _, err := Zone(r.TimeZone); err != nil {
				fe := fielderr.New("time_zone", "%q is not a time zone this service knows", r.TimeZone)
				if i < n.fileRules {
					return fe.In(fmt.Sprintf("rules[%d]", i))
				}
				return fe
			}
		}
		// An empty path matches every path: the file may say so by leaving
		// it out, the admin API must say "/**" (an empty endpoint_pattern
		// sent by mistake would otherwise cover the whole API).
		if i >= n.fileRules && r.Path == "" {
			return fielderr.New("endpoint_pattern", "is empty; name a path or a glob (\"/**\" for every path)")
		}
		// Numbers name the rules made through the admin API.
		if i < n.fileRules && strings.Trim(r.ID, "0123456789") == "" {
			return fielderr.New(n.rule(i, "id", "rule_id"), "%q is a number; numbers are the ids of rules made through the admin API", r.ID)
		}
		// Tiers name their own rules tier_<name>...: a configured rule of
		// such an id would share their counters.
		if strings.HasPrefix(r.ID, "tier_") {
			return fielderr.New(n.rule(i, "id", "rule_id"), "%q starts with tier_, which names the tiers' own rules", r.ID)
		}
		if j, dup := seen[r.ID]; dup {
			return fielderr.New(n.rule(i, "id", "rule_id"), "%q is also the id of rules[%d]", r.ID, j)
		}
		seen[r.ID] = i
		for _, tier := range r.Tiers {
			if !slices.Contains(tierNames, tier) {
				return fielderr.New(n.rule(i, "tiers", "tier_id"), "%q is not a configured tier", tier)
			}
		}
	}
	return nil
}

// validatePathSpelling refuses, when on, a path pattern that fold changes
// (with path_case insensitive, one with an upper-case letter; with
// path_aliases fold, one with a format suffix): requests are matched in
// their folded spelling, so it would never match.
func (s *Spec) validatePathSpelling(n names, on bool, what, setting, value string, fold func(string) string) error {
	if !on {
		return nil
	}
	bad := func(field, p string) error {
		if fold(p) == p {
			return nil
		}
		if setting == "" {
			return fielderr.New(field, "%q has %s; paths are matched without it, so spell it %q", p, what, fold(p))
		}
		return fielderr.New(field, "%q has %s; with %s = %q paths are matched folded, so spell it %q", p, what, setting, value, fold(p))
	}
	for i := range s.Rules {
		if err := bad(n.rule(i, "path", "endpoint_pattern"), s.Rules[i].Path); err != nil {
			return err
		}
	}
	for i := range s.Tiers {
		for _, p := range slices.Sorted(maps.Keys(s.Tiers[i].Endpoints)) {
			f := fmt.Sprintf("endpoints[%q]", p)
			if err := bad(n.tier(i, f, f), p); err != nil {
				return err
			}
		}
	}
	for i, p := range s.APIKeyRequiredPaths {
		if err := bad(fmt.Sprintf("api_key_required_paths[%d]", i), p); err != nil {
			return err
		}
	}
	return nil
}

func (s *Spec) tierNames() []string {
	out := make([]string, len(s.Tiers))
	for i := range s.Tiers {
		out[i] = s.Tiers[i].Name
	}
	return out
}

func (s *Spec) validateTiers(n names) error {
	if len(s.Tiers) == 0 {
		return fielderr.New("tiers", "at least one tier is needed")
	}
	if len(s.Tiers) > MaxTiers {
		return fielderr.New("tiers", "at most %d tiers", MaxTiers)
	}
	for i := range s.Tiers {
		t := &s.Tiers[i]
		if slices.ContainsFunc(s.Tiers[:i], func(o Tier) bool { return o.Name == t.Name }) {
			return fielderr.New(n.tier(i, "name", "name"), "%q is defined twice", t.Name)
		}
		if t.ID < 1 || slices.ContainsFunc(s.Tiers[:i], func(o Tier) bool { return o.ID == t.ID }) {
			return fielderr.New(n.tier(i, "id", "tier_id"), "%d must be a positive number no other tier has", t.ID)
		}
		if err := t.Validate(); err != nil {
			if fe, ok := fielderr.As(err); ok && i < n.fileTiers {
				return fe.In(fmt.Sprintf("tiers[%d]", i))
			}
			return err
		}
	}
	return nil
}

// DefaultTotalFactor is how many times its limit a caller of a per-endpoint
// tier may spend across all paths in one window when the tier sets no
// total_limit.
const DefaultTotalFactor = 10

// IsPerEndpoint reports whether the tier counts each path apart (the
// default).
func (t *Tier) IsPerEndpoint() bool { return t.PerEndpoint == nil || *t.PerEndpoint }

// Total is the tier's bound per caller across all paths: 0 for a tier that
// counts every path on one counter; by default ten times the limit, or the
// burst when that is larger (one path may burst that far).
func (t *Tier) Total() int64 {
	switch {
	case !t.IsPerEndpoint():
		return 0
	case t.TotalLimit != 0:
		return t.TotalLimit
	}
	return min(max(t.Limit*DefaultTotalFactor, t.Burst), rules.MaxQuantity)
}

var endpointRE = regexp.MustCompile(`^/[\x21-\x7e]*$`)

// Validate checks one tier alone; its field names are the same in the file
// and the admin API.
func (t *Tier) Validate() error {
	bad := fielderr.New
	if !rules.ValidTierName(t.Name) {
		return bad("name", "%q must match ^[a-z0-9_]+$", t.Name)
	}
	if t.Limit <= 0 || t.Limit > rules.MaxQuantity {
		return bad("limit", "%d must be in 1..%d", t.Limit, rules.MaxQuantity)
	}
	if t.WindowSeconds < rules.MinWindowSeconds || t.WindowSeconds > rules.MaxWindowSeconds {
		return bad("window_seconds", "%d must be in %d..%d", t.WindowSeconds, rules.MinWindowSeconds, rules.MaxWindowSeconds)
	}
	if t.Algorithm != "" && !rules.ValidAlgorithm(t.Algorithm) {
		return bad("algorithm", "%q must be one of %v", t.Algorithm, rules.Algorithms)
	}
	if t.Burst < 0 || t.Burst > rules.MaxQuantity {
		return bad("burst", "%d must be in 0..%d", t.Burst, rules.MaxQuantity)
	}
	if low := max(t.Limit, t.Burst); t.TotalLimit != 0 && (t.TotalLimit < low || t.TotalLimit > rules.MaxQuantity) {
		return bad("total_limit", "%d must be in %d..%d (at least the tier's limit and burst; 0 for %d times the limit)", t.TotalLimit, low, rules.MaxQuantity, DefaultTotalFactor)
	}
	if t.TotalLimit != 0 && !t.IsPerEndpoint() {
		return bad("total_limit", "applies to a per-endpoint tier only; this tier counts every path on one counter already")
	}
	if len(t.Description) > MaxDescriptionLen || !identity.Printable(t.Description) {
		return bad("description", "must be at most %d bytes of printable text (no control characters)", MaxDescriptionLen)
	}
	if len(t.Endpoints) > MaxTierEndpoints {
		return bad("endpoints", "at most %d endpoints per tier", MaxTierEndpoints)
	}
	for _, p := range slices.Sorted(maps.Keys(t.Endpoints)) {
		field := fmt.Sprintf("endpoints[%q]", p)
		if !endpointRE.MatchString(p) {
			return bad(field, "endpoint path must start with '/' and hold printable ASCII only (globs: *, **, ?)")
		}
		// ValidateGlob also refuses a pattern that is not spelled as
		// requests are normalised ("/items/" would never match).
		if err := rules.ValidateGlob(p); err != nil {
			return bad(field, "%v", err)
		}
		if t.Endpoints[p] <= 0 {
			return bad(field, "%d must be > 0", t.Endpoints[p])
		}
		// An endpoint override narrows its tier; above the tier it would
		// sell more than the tier does.
		if t.Endpoints[p] > t.Limit {
			return bad(field, "%d is above the tier's limit (%d)", t.Endpoints[p], t.Limit)
		}
	}
	return nil
}

func (e *Exemptions) validate() error {
	for i, s := range e.IPs {
		if _, err := ParseIPOrPrefix(s); err != nil {
			return fielderr.New(fmt.Sprintf("exemptions.ips[%d]", i), "%q is not an IP address or CIDR", s)
		}
	}
	for i, s := range e.Users {
		if _, err := identity.User(s); err != nil {
			return fielderr.At(fmt.Sprintf("exemptions.users[%d]", i), err)
		}
	}
	for i, s := range e.Keys {
		if _, err := identity.Key(s); err != nil {
			return fielderr.At(fmt.Sprintf("exemptions.keys[%d]", i), err)
		}
	}
	return nil
}

// ParseIPOrPrefix reads "192.0.2.1" as a /32 (or /128) and "10.0.0.0/8" as is,
// canonicalised the way identities are.
func ParseIPOrPrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return netip.Prefix{}, err
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			// Identities hold a mapped address as the IPv4 one it maps:
			// "::ffff:10.0.0.0/104" is 10.0.0.0/8, or it would exempt no
			// caller.
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := identity.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// questionBytes is what a pattern counts toward MaxQuestionPatternBytes:
// its length when it holds a '?', else nothing.
func questionBytes(p string) int {
	if strings.IndexByte(p, '?') < 0 {
		return 0
	}
	return len(p)
}
