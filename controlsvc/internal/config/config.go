// Package config loads the control service's settings: defaults, then a TOML
// file, then TOLLGATE_* environment variables, validated once with errors that
// name the bad field or variable.
package config

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
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
	// MaxConnectionsPerAddress bounds the connections one peer address
	// holds on each listener (connlimit).
	MaxConnectionsPerAddress int `toml:"max_connections_per_address"`
	// MaxBatch bounds the checks of one batch.
	MaxBatch int `toml:"max_batch"`
	// HeaderPrefix starts the X-RateLimit fields' names.
	HeaderPrefix string `toml:"header_prefix"`
	// TLS on the listener: a certificate and its key (PEM files), and a CA
	// bundle whose certificates the clients (the filter's Envoy cluster)
	// must present one of (mutual TLS). All empty: plain HTTP.
	TLSCertFile     string `toml:"tls_cert_file"`
	TLSKeyFile      string `toml:"tls_key_file"`
	TLSClientCAFile string `toml:"tls_client_ca_file"`
	// GRPCListen is the address of Envoy's rate limit service protocol
	// (gRPC); empty turns it off. RLSConfig is its configuration, a YAML
	// file or directory in envoyproxy/ratelimit's format.
	GRPCListen string `toml:"grpc_listen"`
	RLSConfig  string `toml:"rls_config"`
	// RedisEnabled false keeps every state in memory (one instance).
	RedisEnabled bool `toml:"redis_enabled"`
	// Replicas is the number of control-service replicas: while Redis
	// cannot be reached each counts locally at every limit divided by it.
	Replicas int64 `toml:"replicas"`
	// RLSIETFHeaders adds the IETF httpapi fields to the rate limit
	// service's response headers.
	RLSIETFHeaders bool `toml:"rls_ietf_headers"`
	// ThrottleMaxWaitMs bounds the delay of a throttle rule.
	ThrottleMaxWaitMs int `toml:"throttle_max_wait_ms"`
	// RetryAfterJitter lengthens each refusal's Retry-After by a random
	// share of it, up to this fraction.
	RetryAfterJitter float64 `toml:"retry_after_jitter"`
	// Enabled false turns rate limiting off: every check is admitted
	// without counting (seed 001's global switch).
	Enabled bool `toml:"enabled"`
	// ShadowMode counts and logs every check, refuses none: a denial is
	// answered as a log-only pass.
	ShadowMode bool `toml:"shadow_mode"`

	Lease     Lease     `toml:"lease"`
	Penalties Penalties `toml:"penalties"`
	// Spec is the file's rule model: path_case, default_tier,
	// default_algorithm, exemptions, tiers, api_key_required_paths and rules.
	policy.Spec
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

// Default returns the settings used when nothing else is given: each
// declared setting's default, two tiers and the penalty multipliers.
func Default() Config {
	c := Config{
		Penalties: Penalties{Multipliers: []int64{1, 2, 4, 8}},
		Spec: policy.Spec{Tiers: []policy.Tier{
			{ID: 1, Name: "free", Limit: 100, WindowSeconds: 60},
			{ID: 2, Name: "premium", Limit: 1000, WindowSeconds: 60},
		}},
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
// bad one: the declared settings' bounds, then each section, then the rule
// model.
func (c *Config) Validate() error {
	for _, validate := range []func() error{c.validateSettings, c.validateTokens, c.validateTLS, c.Penalties.validate, c.Spec.Validate} {
		if err := validate(); err != nil {
			return err
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
		for _, a := range admins {
			if a.Token == t {
				// The decision token is in every filter's configuration:
				// each copy would be an operator's credential.
				return bad(fmt.Sprintf("decision_token[%d]", i), "is also an admin token (%s's); the filters' configurations would hold an operator's credential", a.Name)
			}
		}
	}
	if len(toks) == 0 && !loopback(c.Listen) {
		return bad("decision_token", "is required when listen (%s) is not a loopback address: "+
			"anyone who reaches the decision API could otherwise spend other callers' quota", c.Listen)
	}
	if len(toks) == 0 && c.GRPCListen != "" && !loopback(c.GRPCListen) {
		return bad("decision_token", "is required when grpc_listen (%s) is not a loopback address: "+
			"anyone who reaches the rate limit service could otherwise spend other callers' quota", c.GRPCListen)
	}
	return nil
}

// validateTLS checks that the TLS files come as a usable set and load.
func (c *Config) validateTLS() error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return fielderr.New("tls_key_file", "tls_cert_file and tls_key_file go together")
	}
	if c.TLSClientCAFile != "" && c.TLSCertFile == "" {
		return fielderr.New("tls_client_ca_file", "needs tls_cert_file and tls_key_file: client certificates are verified over TLS")
	}
	if c.TLSCertFile == "" {
		return nil
	}
	_, err := c.TLS()
	return err
}

// TLS is the listener's TLS configuration, or nil for plain HTTP: TLS 1.2
// at least, and with a client CA every client must present a certificate
// it signed.
func (c *Config) TLS() (*tls.Config, error) {
	if c.TLSCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		return nil, fielderr.New("tls_cert_file", "%v", err)
	}
	t := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSClientCAFile != "" {
		pem, err := os.ReadFile(c.TLSClientCAFile)
		if err != nil {
			return nil, fielderr.New("tls_client_ca_file", "%v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fielderr.New("tls_client_ca_file", "holds no PEM certificate")
		}
		t.ClientCAs, t.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return t, nil
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
