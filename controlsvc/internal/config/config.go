// Package config loads the control service's settings: defaults, then a TOML
// file, then TOLLGATE_* environment variables, validated once with errors that
// name the bad field or variable.
package config

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/paths"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Failure modes: what a decision does when Redis cannot be asked.
const (
	FailOpen   = "fail_open"   // allow, flagged as degraded
	FailClosed = "fail_closed" // 503 SERVICE_UNAVAILABLE
)

// Path case: whether "/API/Items" and "/api/items" are one resource. Set
// insensitive for an upstream that routes paths case-insensitively
// (Express's default, ASP.NET, IIS): counted apart, a client would get a
// fresh counter per spelling.
const (
	PathCaseSensitive   = "sensitive"
	PathCaseInsensitive = "insensitive"
)

// Config is every setting of the control service.
type Config struct {
	// Listen is the HTTP address (TOLLGATE_LISTEN).
	Listen string `toml:"listen"`
	// RedisURL selects the topology: redis:// or rediss:// (single),
	// redis-sentinel://h1:p1,h2:p2/db?master=name, redis-cluster://h1:p1,h2:p2.
	RedisURL string `toml:"redis_url"`
	// RedisTimeoutMs bounds each Redis call; a slow Redis becomes a failure
	// (and the failure mode) instead of a queue.
	RedisTimeoutMs int `toml:"redis_timeout_ms"`
	RedisPoolSize  int `toml:"redis_pool_size"`
	// RedisBreakerThreshold consecutive Redis failures stop calls to Redis for
	// RedisBreakerCooldownMs; then one call probes.
	RedisBreakerThreshold  int `toml:"redis_breaker_threshold"`
	RedisBreakerCooldownMs int `toml:"redis_breaker_cooldown_ms"`
	// AdminToken guards the admin API; empty disables it. Several tokens
	// are comma-separated; each may carry its holder's name, "name:token",
	// which the audit trail records as who acted. Never logged.
	AdminToken string `toml:"admin_token"`
	// DecisionToken is the service credential of the decision API: one
	// token, or two separated by a comma while rotating. The filter sends it
	// as a bearer token. Required when Listen is not a loopback address;
	// without it only the plain check shape is served. Never logged.
	DecisionToken string `toml:"decision_token"`
	// MaxAdhocLimit bounds a limit a check or an override names itself.
	MaxAdhocLimit int64  `toml:"max_adhoc_limit"`
	FailureMode   string `toml:"failure_mode"`
	LogLevel      string `toml:"log_level"`
	// MaxBodyBytes bounds request bodies (413 beyond).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// MaxBatch bounds the checks of one batch.
	MaxBatch int `toml:"max_batch"`
	// PathCase is PathCaseSensitive or PathCaseInsensitive.
	PathCase string `toml:"path_case"`

	DefaultTier      string          `toml:"default_tier"`
	DefaultAlgorithm rules.Algorithm `toml:"default_algorithm"`
	Lease            Lease           `toml:"lease"`
	Penalties        Penalties       `toml:"penalties"`
	Exemptions       Exemptions      `toml:"exemptions"`
	Tiers            []Tier          `toml:"tiers"`
	// APIKeyRequiredPaths are path globs whose callers must present an API
	// key (401 MISSING_API_KEY without one).
	APIKeyRequiredPaths []string     `toml:"api_key_required_paths"`
	Rules               []rules.Rule `toml:"rules"`
	// OverrideRefreshMs is how often a replica compares the shared version
	// of runtime rules, tiers and overrides with the one it applied: the
	// backstop for a change announcement it missed.
	OverrideRefreshMs int `toml:"override_refresh_ms"`
}

// Lease bounds the tokens a filter may cache locally.
type Lease struct {
	// Fraction of what is left that one lease may take (0 disables leases).
	Fraction float64 `toml:"fraction"`
	// Max tokens in one lease.
	Max int64 `toml:"max"`
	// TTLMs is how long a lease may be spent.
	TTLMs int64 `toml:"ttl_ms"`
}

// Penalties is the progressive penalty policy: callers that keep hitting
// their limit wait longer each time.
type Penalties struct {
	Enabled                bool    `toml:"enabled"`
	DetectionWindowSeconds int64   `toml:"detection_window_seconds"`
	ViolationThreshold     int64   `toml:"violation_threshold"`
	Multipliers            []int64 `toml:"multipliers"`
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
	// Endpoints are per-path overrides: path (or glob) → limit in the window.
	Endpoints   map[string]int64 `json:"endpoints,omitempty" toml:"endpoints"`
	Description string           `json:"description,omitempty" toml:"description"`
	// RequireAPIKey refuses callers of this tier without an API key (401
	// MISSING_API_KEY).
	RequireAPIKey bool `json:"require_api_key,omitempty" toml:"require_api_key"`
}

// Default returns the settings used when nothing else is given: each
// declared setting's default, two tiers and the penalty multipliers.
func Default() Config {
	c := Config{
		Penalties: Penalties{Multipliers: []int64{1, 2, 4, 8}},
		Tiers: []Tier{
			{ID: 1, Name: "free", Limit: 100, WindowSeconds: 60},
			{ID: 2, Name: "premium", Limit: 1000, WindowSeconds: 60},
		},
	}
	for _, st := range Settings {
		if err := st.set(&c, st.Default); err != nil {
			panic("config: default of " + st.Field + ": " + err.Error()) // a declaration is wrong
		}
	}
	return c
}

// Load builds the configuration: defaults, then the TOML file at path (none
// when empty), then the environment (lookup is os.LookupEnv in production).
// A file that sets tiers replaces the default tiers.
func Load(path string, lookup func(string) (string, bool)) (*Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
	}
	cfg, err := Parse(data, lookup)
	if err != nil && path != "" {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, err
}

// Parse is Load on the file's bytes (empty: no file).
func Parse(data []byte, lookup func(string) (string, bool)) (*Config, error) {
	cfg := Default()
	if len(data) > 0 {
		if err := decode(data, &cfg); err != nil {
			return nil, err
		}
	}
	if err := applyEnv(&cfg, lookup); err != nil {
		return nil, err
	}
	for i := range cfg.Tiers {
		if cfg.Tiers[i].ID == 0 {
			cfg.Tiers[i].ID = i + 1
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	for i := range cfg.Rules {
		// Numbers name the rules made through the admin API.
		if id := cfg.Rules[i].ID; strings.Trim(id, "0123456789") == "" {
			return nil, fmt.Errorf("invalid config: %w", fielderr.New(fmt.Sprintf("rules[%d].id", i), "%q is a number; numbers are the ids of rules made through the admin API", id))
		}
	}
	return &cfg, nil
}

func decode(data []byte, cfg *Config) error {
	// A file that lists tiers states all of them.
	var probe struct {
		Tiers []toml.Primitive `toml:"tiers"`
	}
	if _, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&probe); err == nil && probe.Tiers != nil {
		cfg.Tiers = nil
	}
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(cfg)
	if err != nil {
		return err
	}
	if un := md.Undecoded(); len(un) > 0 {
		names := make([]string, len(un))
		for i, k := range un {
			names[i] = k.String()
		}
		return fmt.Errorf("unknown setting %s", strings.Join(names, ", "))
	}
	return nil
}

// Validate checks every field and returns a *fielderr.Error naming the first
// bad one: the declared settings' bounds, then each section.
func (c *Config) Validate() error {
	for _, validate := range []func() error{c.validateSettings, c.validateTokens, c.Penalties.validate, c.Exemptions.validate, c.validateTiers} {
		if err := validate(); err != nil {
			return err
		}
	}
	names := c.tierNames()
	if !slices.Contains(names, c.DefaultTier) {
		return fielderr.New("default_tier", "%q is not a configured tier (have %s)", c.DefaultTier, strings.Join(names, ", "))
	}
	for i := range c.Rules {
		for _, tier := range c.Rules[i].Tiers {
			if !slices.Contains(names, tier) {
				return fielderr.New(fmt.Sprintf("rules[%d].tiers", i), "%q is not a configured tier", tier)
			}
		}
	}
	if _, err := rules.NewSet("check", c.Rules); err != nil {
		return fielderr.At("rules", err)
	}
	for i, p := range c.APIKeyRequiredPaths {
		if err := rules.ValidateGlob(p); err != nil {
			return fielderr.New(fmt.Sprintf("api_key_required_paths[%d]", i), "%v", err)
		}
	}
	return c.validatePathCase()
}

// validatePathCase refuses, with path_case insensitive, a path pattern with
// an upper-case letter: requests are matched in lower case, so it would
// never match.
func (c *Config) validatePathCase() error {
	if c.PathCase != PathCaseInsensitive {
		return nil
	}
	bad := func(field, p string) error {
		if paths.FoldCase(p) == p {
			return nil
		}
		return fielderr.New(field, "%q has upper-case letters; with path_case = %q paths are matched in lower case, so spell it %q", p, PathCaseInsensitive, paths.FoldCase(p))
	}
	for i := range c.Rules {
		if err := bad(fmt.Sprintf("rules[%d].path", i), c.Rules[i].Path); err != nil {
			return err
		}
	}
	for i := range c.Tiers {
		for _, p := range slices.Sorted(maps.Keys(c.Tiers[i].Endpoints)) {
			if err := bad(fmt.Sprintf("tiers[%d].endpoints[%q]", i, p), p); err != nil {
				return err
			}
		}
	}
	for i, p := range c.APIKeyRequiredPaths {
		if err := bad(fmt.Sprintf("api_key_required_paths[%d]", i), p); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) tierNames() []string {
	names := make([]string, len(c.Tiers))
	for i := range c.Tiers {
		names[i] = c.Tiers[i].Name
	}
	return names
}

// Bounds on what a configuration holds (the file's and the runtime's
// together): every check walks the rules of its scopes, and a policy is
// compiled on every change.
const (
	MaxRules         = 1000
	MaxTiers         = 256
	MaxTierEndpoints = 256
	// MaxDescriptionLen bounds a tier's description: it is stored in the
	// shared rule set and sent in every listing.
	MaxDescriptionLen = 256
)

func (c *Config) validateTiers() error {
	if len(c.Tiers) == 0 {
		return fielderr.New("tiers", "at least one tier is needed")
	}
	if len(c.Tiers) > MaxTiers {
		return fielderr.New("tiers", "at most %d tiers", MaxTiers)
	}
	if len(c.Rules) > MaxRules {
		return fielderr.New("rules", "at most %d rules", MaxRules)
	}
	for i := range c.Tiers {
		at := fmt.Sprintf("tiers[%d]", i)
		if slices.Contains(c.tierNames()[:i], c.Tiers[i].Name) {
			return fielderr.New(at+".name", "%q is defined twice", c.Tiers[i].Name)
		}
		if id := c.Tiers[i].ID; id < 1 || slices.ContainsFunc(c.Tiers[:i], func(t Tier) bool { return t.ID == id }) {
			return fielderr.New(at+".id", "%d must be a positive number no other tier has", id)
		}
		if err := c.Tiers[i].validate(); err != nil {
			return fielderr.At(at, err)
		}
	}
	return nil
}

var endpointRE = regexp.MustCompile(`^/[\x21-\x7e]*$`)

func (t *Tier) validate() error {
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

// MaxLease bounds lease.max: as max_adhoc_limit bounds a limit, so that no
// number a script adds up comes near what a Lua double holds exactly.
const MaxLease = 1_000_000_000

// MinTokenLen is the shortest credential accepted: a token an attacker can
// guess protects nothing, and 32 random characters are out of reach.
const MinTokenLen = 32

// AdminToken is one admin credential and the name of its holder.
type AdminToken struct{ Name, Token string }

var tokenNameChars = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)

// AdminTokens returns the admin credentials; a token without a name is
// "admin".
func (c *Config) AdminTokens() []AdminToken {
	if c.AdminToken == "" {
		return nil
	}
	var out []AdminToken
	for _, t := range strings.Split(c.AdminToken, ",") {
		if name, tok, ok := strings.Cut(t, ":"); ok && tokenNameChars.MatchString(name) && tok != "" {
			out = append(out, AdminToken{Name: name, Token: tok})
			continue
		}
		out = append(out, AdminToken{Name: "admin", Token: t})
	}
	return out
}

// DecisionTokens returns the accepted decision-API tokens (none, one, or two
// while rotating).
func (c *Config) DecisionTokens() []string {
	if c.DecisionToken == "" {
		return nil
	}
	return strings.Split(c.DecisionToken, ",")
}

func (c *Config) validateTokens() error {
	bad := func(field, format string, args ...any) error {
		return fielderr.New(field, format, args...)
	}
	admins := c.AdminTokens()
	for i, t := range admins {
		field := "admin_token"
		if len(admins) > 1 {
			field = fmt.Sprintf("admin_token[%d]", i)
		}
		if err := checkToken(t.Token); err != nil {
			return bad(field, "%v", err)
		}
	}
	toks := c.DecisionTokens()
	if len(toks) > 2 {
		return bad("decision_token", "at most two tokens (the current one and the next), comma-separated")
	}
	for i, t := range toks {
		if err := checkToken(t); err != nil {
			return bad(fmt.Sprintf("decision_token[%d]", i), "%v", err)
		}
		if t == wire.ExampleDecisionToken {
			return bad(fmt.Sprintf("decision_token[%d]", i), "is the example placeholder; generate one (head -c 32 /dev/urandom | base64)")
		}
	}
	if len(toks) == 0 && !loopback(c.Listen) {
		return bad("decision_token", "is required when listen (%s) is not a loopback address: "+
			"anyone who reaches the decision API could otherwise spend other callers' quota", c.Listen)
	}
	return nil
}

// checkToken never quotes the token: errors reach logs.
func checkToken(t string) error {
	if len(t) < MinTokenLen {
		return fmt.Errorf("is %d bytes; at least %d (random) are needed", len(t), MinTokenLen)
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return fmt.Errorf("must be printable ASCII without spaces")
		}
	}
	return nil
}

// loopback reports whether a listen address only accepts local connections.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// MaxViolations is how many violations the penalty log of one owner keeps
// (epilogue.lua trims it to this).
const MaxViolations = 1000

// validate checks the multipliers; the scalar penalty settings are declared
// (and bounded) in Settings.
func (p *Penalties) validate() error {
	if len(p.Multipliers) == 0 || len(p.Multipliers) > 32 {
		return fielderr.New("penalties.multipliers", "need 1..32 entries")
	}
	for i, m := range p.Multipliers {
		if m < 1 || m > 1000 {
			return fielderr.New(fmt.Sprintf("penalties.multipliers[%d]", i), "%d must be in 1..1000", m)
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
		return p.Masked(), nil
	}
	a, err := identity.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// RedactURL hides a password in a Redis URL.
func RedactURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return u
	}
	user, _, _ := strings.Cut(rest[:at], ":")
	return scheme + "://" + user + ":[redacted]@" + rest[at+1:]
}

// RedisTimeout is RedisTimeoutMs as a duration.
func (c *Config) RedisTimeout() time.Duration {
	return time.Duration(c.RedisTimeoutMs) * time.Millisecond
}

func validPort(p string) bool {
	_, err := strconv.ParseUint(p, 10, 16)
	return err == nil
}
