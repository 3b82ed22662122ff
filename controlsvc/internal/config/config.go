// Package config loads the control service's settings: defaults, then a TOML
// file, then TOLLGATE_* environment variables, validated once with errors that
// name the bad field or variable.
package config

import (
	"github.com/tollgate-rl/tollgate/shared/fielderr"

	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Failure modes: what a decision does when Redis cannot be asked.
const (
	FailOpen   = "fail_open"   // allow, flagged as degraded
	FailClosed = "fail_closed" // 503 SERVICE_UNAVAILABLE
)

// Config is every setting of the control service.
type Config struct {
	// Listen is the HTTP address (TOLLGATE_LISTEN).
	Listen string `toml:"listen"`
	// RedisURL selects the topology: redis:// or rediss:// (single),
	// redis-sentinel://h1:p1,h2:p2/db?master=name, redis-cluster://h1:p1,h2:p2.
	RedisURL string `toml:"redis_url"`
	// RedisTimeoutMS bounds each Redis call; a slow Redis becomes a failure
	// (and the failure mode) instead of a queue.
	RedisTimeoutMS int `toml:"redis_timeout_ms"`
	RedisPoolSize  int `toml:"redis_pool_size"`
	// RedisBreakerThreshold consecutive Redis failures stop calls to Redis for
	// RedisBreakerCooldownMS; then one call probes.
	RedisBreakerThreshold  int `toml:"redis_breaker_threshold"`
	RedisBreakerCooldownMS int `toml:"redis_breaker_cooldown_ms"`
	// AdminToken guards the admin API; empty disables it. Never logged.
	AdminToken string `toml:"admin_token"`
	// DecisionToken is the service credential of the decision API: one
	// token, or two separated by a comma while rotating. The filter sends it
	// as a bearer token. Required when Listen is not a loopback address;
	// without it only the seed's plain check shape is served. Never logged.
	DecisionToken string `toml:"decision_token"`
	// MaxAdhocLimit bounds a limit a check or an override names itself.
	MaxAdhocLimit int64  `toml:"max_adhoc_limit"`
	FailureMode   string `toml:"failure_mode"`
	LogLevel      string `toml:"log_level"`
	// MaxBodyBytes bounds request bodies (413 beyond).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// MaxBatch bounds the checks of one batch.
	MaxBatch int `toml:"max_batch"`

	DefaultTier      string          `toml:"default_tier"`
	DefaultAlgorithm rules.Algorithm `toml:"default_algorithm"`
	Lease            Lease           `toml:"lease"`
	Penalties        Penalties       `toml:"penalties"`
	Exemptions       Exemptions      `toml:"exemptions"`
	Tiers            []Tier          `toml:"tiers"`
	Rules            []rules.Rule    `toml:"rules"`
	// OverrideRefreshMS is how often overrides set through the API by other
	// instances are picked up.
	OverrideRefreshMS int `toml:"override_refresh_ms"`
}

// Lease bounds the tokens a filter may cache locally.
type Lease struct {
	// Fraction of what is left that one lease may take (0 disables leases).
	Fraction float64 `toml:"fraction"`
	// Max tokens in one lease.
	Max int64 `toml:"max"`
	// TTLMS is how long a lease may be spent.
	TTLMS int64 `toml:"ttl_ms"`
}

// Penalties is the progressive penalty policy (seed 000).
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
	Name          string          `toml:"name"`
	Limit         int64           `toml:"limit"`
	WindowSeconds int64           `toml:"window_seconds"`
	Algorithm     rules.Algorithm `toml:"algorithm"`
	Burst         int64           `toml:"burst"`
	// PerEndpoint counts each path separately (default true, as in seed 001).
	PerEndpoint *bool `toml:"per_endpoint"`
	// Endpoints are per-path overrides: path (or glob) → limit in the window.
	Endpoints   map[string]int64 `toml:"endpoints"`
	Description string           `toml:"description"`
}

// Default returns the settings used when nothing else is given.
func Default() Config {
	return Config{
		Listen:                 "127.0.0.1:8081",
		RedisURL:               "redis://127.0.0.1:6379/0",
		RedisTimeoutMS:         200,
		RedisPoolSize:          64,
		RedisBreakerThreshold:  5,
		RedisBreakerCooldownMS: 1000,
		FailureMode:            FailOpen,
		LogLevel:               "info",
		MaxBodyBytes:           1 << 20,
		MaxBatch:               100,
		MaxAdhocLimit:          1_000_000,
		DefaultTier:            "free",
		DefaultAlgorithm:       rules.TokenBucket,
		Lease:                  Lease{Fraction: 0.1, Max: 100, TTLMS: 1000},
		Penalties:              Penalties{DetectionWindowSeconds: 3600, ViolationThreshold: 3, Multipliers: []int64{1, 2, 4, 8}},
		OverrideRefreshMS:      5000,
		Tiers: []Tier{
			{Name: "free", Limit: 100, WindowSeconds: 60},
			{Name: "premium", Limit: 1000, WindowSeconds: 60},
		},
	}
}

// EnvVar is one environment variable: its name, the setting it overrides
// (spelled as in the file), and how its value is read.
type EnvVar struct {
	Name, Field string
	set         func(c *Config, v string) error // nil: read elsewhere
}

// Env declares every environment variable, once: applyEnv reads them from
// this list and UnknownEnv warns about any other TOLLGATE_* name, so the two
// cannot drift apart.
var Env = []EnvVar{
	{Name: "TOLLGATE_CONFIG", Field: "(the config file's path; read by the command)"},
	text("TOLLGATE_LISTEN", "listen", func(c *Config) *string { return &c.Listen }),
	text("TOLLGATE_REDIS_URL", "redis_url", func(c *Config) *string { return &c.RedisURL }),
	integer("TOLLGATE_REDIS_TIMEOUT_MS", "redis_timeout_ms", func(c *Config) *int { return &c.RedisTimeoutMS }),
	integer("TOLLGATE_REDIS_POOL_SIZE", "redis_pool_size", func(c *Config) *int { return &c.RedisPoolSize }),
	integer("TOLLGATE_REDIS_BREAKER_THRESHOLD", "redis_breaker_threshold", func(c *Config) *int { return &c.RedisBreakerThreshold }),
	integer("TOLLGATE_REDIS_BREAKER_COOLDOWN_MS", "redis_breaker_cooldown_ms", func(c *Config) *int { return &c.RedisBreakerCooldownMS }),
	text("TOLLGATE_ADMIN_TOKEN", "admin_token", func(c *Config) *string { return &c.AdminToken }),
	text("TOLLGATE_DECISION_TOKEN", "decision_token", func(c *Config) *string { return &c.DecisionToken }),
	integer("TOLLGATE_MAX_ADHOC_LIMIT", "max_adhoc_limit", func(c *Config) *int64 { return &c.MaxAdhocLimit }),
	text("TOLLGATE_FAILURE_MODE", "failure_mode", func(c *Config) *string { return &c.FailureMode }),
	text("TOLLGATE_LOG_LEVEL", "log_level", func(c *Config) *string { return &c.LogLevel }),
	integer("TOLLGATE_MAX_BODY_BYTES", "max_body_bytes", func(c *Config) *int64 { return &c.MaxBodyBytes }),
	integer("TOLLGATE_MAX_BATCH", "max_batch", func(c *Config) *int { return &c.MaxBatch }),
	text("TOLLGATE_DEFAULT_TIER", "default_tier", func(c *Config) *string { return &c.DefaultTier }),
	text("TOLLGATE_DEFAULT_ALGORITHM", "default_algorithm", func(c *Config) *rules.Algorithm { return &c.DefaultAlgorithm }),
	number("TOLLGATE_LEASE_FRACTION", "lease.fraction", func(c *Config) *float64 { return &c.Lease.Fraction }),
	integer("TOLLGATE_LEASE_MAX", "lease.max", func(c *Config) *int64 { return &c.Lease.Max }),
	integer("TOLLGATE_LEASE_TTL_MS", "lease.ttl_ms", func(c *Config) *int64 { return &c.Lease.TTLMS }),
	boolean("TOLLGATE_PENALTIES_ENABLED", "penalties.enabled", func(c *Config) *bool { return &c.Penalties.Enabled }),
	integer("TOLLGATE_PENALTIES_DETECTION_WINDOW_SECONDS", "penalties.detection_window_seconds", func(c *Config) *int64 { return &c.Penalties.DetectionWindowSeconds }),
	integer("TOLLGATE_PENALTIES_VIOLATION_THRESHOLD", "penalties.violation_threshold", func(c *Config) *int64 { return &c.Penalties.ViolationThreshold }),
	integer("TOLLGATE_OVERRIDE_REFRESH_MS", "override_refresh_ms", func(c *Config) *int { return &c.OverrideRefreshMS }),
}

// text declares a variable taken as it is. A secret's value never appears in
// an error: there is no parse error to quote it.
func text[T ~string](name, field string, dst func(*Config) *T) EnvVar {
	return EnvVar{name, field, func(c *Config, v string) error {
		*dst(c) = T(v)
		return nil
	}}
}

func integer[T int | int64](name, field string, dst func(*Config) *T) EnvVar {
	return EnvVar{name, field, func(c *Config, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || int64(T(n)) != n {
			return fmt.Errorf("%s: %q is not an integer", name, v)
		}
		*dst(c) = T(n)
		return nil
	}}
}

func number(name, field string, dst func(*Config) *float64) EnvVar {
	return EnvVar{name, field, func(c *Config, v string) error {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not a number", name, v)
		}
		*dst(c) = f
		return nil
	}}
}

func boolean(name, field string, dst func(*Config) *bool) EnvVar {
	return EnvVar{name, field, func(c *Config, v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s: %q is not true or false", name, v)
		}
		*dst(c) = b
		return nil
	}}
}

// UnknownEnv returns the TOLLGATE_* variables of environ ("K=V" entries)
// that no setting reads: most likely misspelt, and silently ignored otherwise.
func UnknownEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TOLLGATE_") {
			continue
		}
		known := false
		for _, e := range Env {
			known = known || e.Name == name
		}
		if !known {
			out = append(out, name)
		}
	}
	return out
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
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
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

func applyEnv(cfg *Config, lookup func(string) (string, bool)) error {
	for _, e := range Env {
		if e.set == nil {
			continue
		}
		if v, ok := lookup(e.Name); ok {
			if err := e.set(cfg, v); err != nil {
				return err
			}
		}
	}
	return nil
}

var logLevels = []string{"debug", "info", "warn", "error"}

var endpointRE = regexp.MustCompile(`^/[\x21-\x7e]*$`)

// Validate checks every field and returns a *fielderr.Error naming the first
// bad one.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fielderr.New(field, format, args...)
	}
	if _, port, err := net.SplitHostPort(c.Listen); err != nil || !validPort(port) {
		return bad("listen", "%q must be host:port", c.Listen)
	}
	if c.RedisURL == "" {
		return bad("redis_url", "must be set")
	}
	if c.RedisTimeoutMS < 1 || c.RedisTimeoutMS > 60_000 {
		return bad("redis_timeout_ms", "%d must be in 1..60000", c.RedisTimeoutMS)
	}
	if c.RedisPoolSize < 1 || c.RedisPoolSize > 10_000 {
		return bad("redis_pool_size", "%d must be in 1..10000", c.RedisPoolSize)
	}
	if c.RedisBreakerThreshold < 1 || c.RedisBreakerThreshold > 1000 {
		return bad("redis_breaker_threshold", "%d must be in 1..1000", c.RedisBreakerThreshold)
	}
	if c.RedisBreakerCooldownMS < 10 || c.RedisBreakerCooldownMS > 600_000 {
		return bad("redis_breaker_cooldown_ms", "%d must be in 10..600000", c.RedisBreakerCooldownMS)
	}
	if err := c.validateTokens(); err != nil {
		return err
	}
	if c.MaxAdhocLimit < 1 || c.MaxAdhocLimit > 1_000_000_000 {
		return bad("max_adhoc_limit", "%d must be in 1..1000000000", c.MaxAdhocLimit)
	}
	if c.FailureMode != FailOpen && c.FailureMode != FailClosed {
		return bad("failure_mode", "%q must be %q or %q", c.FailureMode, FailOpen, FailClosed)
	}
	if !slices.Contains(logLevels, c.LogLevel) {
		return bad("log_level", "%q must be one of %v", c.LogLevel, logLevels)
	}
	if c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 64<<20 {
		return bad("max_body_bytes", "%d must be in 1024..%d", c.MaxBodyBytes, 64<<20)
	}
	if c.MaxBatch < 1 || c.MaxBatch > 10_000 {
		return bad("max_batch", "%d must be in 1..10000", c.MaxBatch)
	}
	if !rules.ValidAlgorithm(c.DefaultAlgorithm) {
		return bad("default_algorithm", "%q must be one of %v", c.DefaultAlgorithm, rules.Algorithms)
	}
	if c.Lease.Fraction < 0 || c.Lease.Fraction > 1 {
		return bad("lease.fraction", "%v must be in 0..1", c.Lease.Fraction)
	}
	if c.Lease.Max < 0 || c.Lease.Max > MaxLease {
		return bad("lease.max", "%d must be in 0..%d", c.Lease.Max, MaxLease)
	}
	if c.Lease.TTLMS < 1 || c.Lease.TTLMS > 60_000 {
		return bad("lease.ttl_ms", "%d must be in 1..60000", c.Lease.TTLMS)
	}
	if c.OverrideRefreshMS < 100 {
		return bad("override_refresh_ms", "%d must be >= 100", c.OverrideRefreshMS)
	}
	if err := c.Penalties.validate(); err != nil {
		return err
	}
	if err := c.Exemptions.validate(); err != nil {
		return err
	}
	if len(c.Tiers) == 0 {
		return bad("tiers", "at least one tier is needed")
	}
	names := make([]string, 0, len(c.Tiers))
	for i := range c.Tiers {
		t := &c.Tiers[i]
		at := fmt.Sprintf("tiers[%d]", i)
		if !rules.ValidTierName(t.Name) {
			return bad(at+".name", "%q must match ^[a-z0-9_]+$", t.Name)
		}
		if slices.Contains(names, t.Name) {
			return bad(at+".name", "%q is defined twice", t.Name)
		}
		names = append(names, t.Name)
		if t.Limit <= 0 {
			return bad(at+".limit", "%d must be > 0", t.Limit)
		}
		if t.WindowSeconds < rules.MinWindowSeconds || t.WindowSeconds > rules.MaxWindowSeconds {
			return bad(at+".window_seconds", "%d must be in %d..%d", t.WindowSeconds, rules.MinWindowSeconds, rules.MaxWindowSeconds)
		}
		if t.Algorithm != "" && !rules.ValidAlgorithm(t.Algorithm) {
			return bad(at+".algorithm", "%q must be one of %v", t.Algorithm, rules.Algorithms)
		}
		if t.Burst < 0 {
			return bad(at+".burst", "%d must be >= 0", t.Burst)
		}
		for _, p := range sortedKeys(t.Endpoints) {
			field := fmt.Sprintf("%s.endpoints[%q]", at, p)
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
		}
	}
	if !slices.Contains(names, c.DefaultTier) {
		return bad("default_tier", "%q is not a configured tier (have %s)", c.DefaultTier, strings.Join(names, ", "))
	}
	for i := range c.Rules {
		for _, tier := range c.Rules[i].Tiers {
			if !slices.Contains(names, tier) {
				return bad(fmt.Sprintf("rules[%d].tiers", i), "%q is not a configured tier", tier)
			}
		}
	}
	if _, err := rules.NewSet("check", c.Rules); err != nil {
		return fielderr.At("rules", err)
	}
	return nil
}

// MaxLease bounds lease.max: as max_adhoc_limit bounds a limit, so that no
// number a script adds up comes near what a Lua double holds exactly.
const MaxLease = 1_000_000_000

// MinTokenLen is the shortest credential accepted: a token an attacker can
// guess protects nothing, and 32 random characters are out of reach.
const MinTokenLen = 32

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
	if t := c.AdminToken; t != "" {
		if err := checkToken(t); err != nil {
			return bad("admin_token", "%v", err)
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

func (p *Penalties) validate() error {
	bad := func(field, format string, args ...any) error {
		return fielderr.New("penalties."+field, format, args...)
	}
	if p.DetectionWindowSeconds < 1 || p.DetectionWindowSeconds > 86_400 {
		return bad("detection_window_seconds", "%d must be in 1..86400", p.DetectionWindowSeconds)
	}
	// The violation log keeps at most MaxViolations entries (its work per
	// denial is bounded), so a higher threshold could never be reached.
	if p.ViolationThreshold < 1 || p.ViolationThreshold > MaxViolations {
		return bad("violation_threshold", "%d must be in 1..%d", p.ViolationThreshold, MaxViolations)
	}
	if len(p.Multipliers) == 0 || len(p.Multipliers) > 32 {
		return bad("multipliers", "need 1..32 entries")
	}
	for i, m := range p.Multipliers {
		if m < 1 || m > 1000 {
			return bad(fmt.Sprintf("multipliers[%d]", i), "%d must be in 1..1000", m)
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

// RedisTimeout is RedisTimeoutMS as a duration.
func (c *Config) RedisTimeout() time.Duration {
	return time.Duration(c.RedisTimeoutMS) * time.Millisecond
}

func sortedKeys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func validPort(p string) bool {
	_, err := strconv.ParseUint(p, 10, 16)
	return err == nil
}
