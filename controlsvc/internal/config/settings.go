package config

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/redisconn"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// ConfigEnv names the config file's path; the command reads it.
const ConfigEnv = "TOLLGATE_CONFIG"

// Setting is one single-valued setting, declared once: its field in the
// file, its environment variable, its default, what it means and what it
// may hold. Default, the environment loader, Validate, -check-config, the
// table in docs/configuration.md and the warning about unknown variables all read Settings.
type Setting struct {
	// Field is the setting's path in the file ("lease.max").
	Field string
	// Env is TOLLGATE_<FIELD>, dots as underscores.
	Env     string
	Default string
	Doc     string
	// Secret values are never printed.
	Secret bool
	set    func(c *Config, v string) error
	get    func(c *Config) string
	check  func(c *Config) error // nil: any value of the type
}

// Settings declares every single-valued setting.
var Settings = []Setting{
	boolean("enabled", true, "`false` turns rate limiting off: every check is admitted as exempt and nothing is counted (the filter stays in place); API keys are still checked where they are required, as access control", func(c *Config) *bool { return &c.Enabled }),
	boolean("shadow_mode", false, "`true` counts and logs every check and refuses none: a denial is answered as a log-only pass (`log_only: true`, with the numbers that would have refused it; `x-tollgate-decision: log_only` upstream; `log_only` in the decisions metric)", func(c *Config) *bool { return &c.ShadowMode }),
	text("listen", "127.0.0.1:8081", "HTTP address", func(c *Config) *string { return &c.Listen }, hostPort),
	text("redis_url", "redis://127.0.0.1:6379/0", "`redis://` or `rediss://` (single), `redis-sentinel://h1:p1,h2:p2/0?master=NAME`, `redis-cluster://h1:p1,h2:p2`",
		func(c *Config) *string { return &c.RedisURL }, redisURL),
	boolean("redis_enabled", true, "`false` runs without Redis: every counter, rule, key, override and audit entry is kept in this process's memory, lost on restart and not shared between replicas (one instance, for trials and tests); the other `redis_*` settings are then unused", func(c *Config) *bool { return &c.RedisEnabled }),
	integer("redis_timeout_ms", 200, 1, 60_000, "bound on each Redis call; a slow Redis becomes a failure (and the failure mode), not a queue", func(c *Config) *int { return &c.RedisTimeoutMs }),
	integer("redis_pool_size", 64, 1, 10_000, "Redis connections", func(c *Config) *int { return &c.RedisPoolSize }),
	integer("redis_breaker_threshold", 5, 1, 1000, "consecutive Redis failures that stop Redis calls", func(c *Config) *int { return &c.RedisBreakerThreshold }),
	integer("redis_breaker_cooldown_ms", 1000, 10, 600_000, "how long Redis calls stay stopped before one probe", func(c *Config) *int { return &c.RedisBreakerCooldownMs }),
	secret("admin_token", "bearer token of the admin API, at least 32 bytes; empty turns the admin API off", func(c *Config) *string { return &c.AdminToken }),
	secret("decision_token", "the decision API's service credential (the filter's `decision_token`), at least 32 bytes; two comma-separated while rotating. Required when `listen` is not loopback; without it only the plain check shape is served",
		func(c *Config) *string { return &c.DecisionToken }),
	integer("max_adhoc_limit", 1_000_000, 1, 1_000_000_000, "the largest `limit` a check or an override may name itself (above it 400 `INVALID_LIMIT`)", func(c *Config) *int64 { return &c.MaxAdhocLimit }),
	oneOf("failure_mode", FailOpen, []string{FailOpen, FailClosed}, "with Redis down: `fail_open` decides in each replica's memory at every limit divided by `replicas` (answers flagged `degraded`), `fail_closed` answers 503", func(c *Config) *string { return &c.FailureMode }),
	integer("replicas", 1, 1, 10_000, "the number of control-service replicas: while Redis cannot be reached and `failure_mode` is `fail_open`, each replica counts in its own memory at every limit divided by this, so that together they admit about the limit", func(c *Config) *int64 { return &c.Replicas }),
	oneOf("log_level", "info", []string{"debug", "info", "warn", "error"}, "least severe log level written", func(c *Config) *string { return &c.LogLevel }),
	integer("max_body_bytes", 1<<20, 1024, 64<<20, "request bodies beyond this are refused (413)", func(c *Config) *int64 { return &c.MaxBodyBytes }),
	integer("max_connections_per_address", 1024, 1, 1_000_000, "connections one peer address (an IPv6 peer's /64) may hold open on each listener (HTTP, gRPC); more are closed at once. Envoy opens at most 1,024 to a cluster by default (its circuit breakers' `max_connections`). All peers together hold at most three quarters of the process's file descriptors, so a few sources' idle connections cannot take the descriptors Redis and the other proxies need", func(c *Config) *int { return &c.MaxConnectionsPerAddress }),
	text("tls_cert_file", "", "PEM certificate of the listener: with `tls_key_file`, the service speaks HTTPS", func(c *Config) *string { return &c.TLSCertFile }, nil),
	text("tls_key_file", "", "PEM private key of `tls_cert_file`", func(c *Config) *string { return &c.TLSKeyFile }, nil),
	text("tls_client_ca_file", "", "PEM CA bundle: every client (the filter's Envoy cluster) must present a certificate it signed (mutual TLS)", func(c *Config) *string { return &c.TLSClientCAFile }, nil),
	text("grpc_listen", "", "address of Envoy's rate limit service protocol (gRPC `envoy.service.ratelimit.v3.RateLimitService`, e.g. `127.0.0.1:8082`); empty turns it off. Needs `decision_token` beyond loopback; uses the listener's TLS files too",
		func(c *Config) *string { return &c.GRPCListen }, optionalHostPort),
	text("rls_config", "", "the rate limit service's descriptors: a YAML file, or a directory of them, in envoyproxy/ratelimit's format (reloaded when it changes); the `tollgate` domain needs none",
		func(c *Config) *string { return &c.RLSConfig }, nil),
	boolean("rls_ietf_headers", false, "the rate limit service's answers also carry the IETF httpapi `RateLimit-Policy` and `RateLimit` fields (Envoy adds them to the client's response)", func(c *Config) *bool { return &c.RLSIETFHeaders }),
	integer("throttle_max_wait_ms", 100, 0, 10_000, "the longest a `throttle` rule delays a refused request until it would be admitted (past it: refused); keep it under the filter's `timeout_ms`", func(c *Config) *int { return &c.ThrottleMaxWaitMs }),
	number("retry_after_jitter", 0, 0, 1, "lengthens each refusal's `Retry-After` (and `retry_after`) by a random share of it, up to this fraction (0.2: up to 20 % later), so that callers refused together do not all come back in the same second", func(c *Config) *float64 { return &c.RetryAfterJitter }),
	integer("max_batch", 100, 1, 10_000, "checks in one batch", func(c *Config) *int { return &c.MaxBatch }),
	text("header_prefix", wire.DefaultHeaderPrefix, "starts the names of the `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Window` and `-Strategy` fields of the decision API's answers (the filter's `headers.prefix` names its own)", func(c *Config) *string { return &c.HeaderPrefix }, headerPrefix),
	oneOf("path_case", policy.PathCaseSensitive, []string{policy.PathCaseSensitive, policy.PathCaseInsensitive}, "`insensitive` counts `/API/Items` and `/api/items` as one path (set it when the upstream routes paths case-insensitively; rule patterns must then be lower-case)", func(c *Config) *string { return &c.PathCase }),
	oneOf("path_aliases", policy.PathAliasesKeep, []string{policy.PathAliasesKeep, policy.PathAliasesFold}, "`fold` counts `/login.json`, `/login.` and `/login%20` as `/login` (set it when the upstream routes a format suffix or trailing dots and spaces to one handler; rule patterns must then be written without them)", func(c *Config) *string { return &c.PathAliases }),
	text("default_tier", "free", "tier of callers that name none (must be a configured tier)", func(c *Config) *string { return &c.DefaultTier }, nil),
	oneOf("default_algorithm", string(rules.TokenBucket), algorithmNames(), "algorithm of tiers and limits that name none", func(c *Config) *rules.Algorithm { return &c.DefaultAlgorithm }),
	number("lease.fraction", 0.1, 0, 1, "share of what is left that one filter lease may take (0 turns leases off)", func(c *Config) *float64 { return &c.Lease.Fraction }),
	integer("lease.max", 100, 0, MaxLease, "tokens in one lease", func(c *Config) *int64 { return &c.Lease.Max }),
	integer("lease.ttl_ms", 1000, 1, 60_000, "how long a lease may be spent", func(c *Config) *int64 { return &c.Lease.TTLMs }),
	boolean("penalties.enabled", false, "progressive penalties for callers that keep hitting their limit", func(c *Config) *bool { return &c.Penalties.Enabled }),
	integer("penalties.detection_window_seconds", 3600, 1, 86_400, "the window violations are counted in", func(c *Config) *int64 { return &c.Penalties.DetectionWindowSeconds }),
	// The violation log keeps at most MaxViolations entries (its work per
	// denial is bounded), so a higher threshold could never be reached.
	integer("penalties.violation_threshold", 3, 1, MaxViolations, "violations in the window before penalties apply", func(c *Config) *int64 { return &c.Penalties.ViolationThreshold }),
	integer("override_refresh_ms", 1000, 100, 3_600_000, "how often a replica checks the shared version of rules, tiers and overrides, in case it missed a change's announcement (changes otherwise apply at once)", func(c *Config) *int { return &c.OverrideRefreshMs }),
}

func algorithmNames() []string {
	out := make([]string, len(rules.Algorithms))
	for i, a := range rules.Algorithms {
		out[i] = string(a)
	}
	return out
}

func envName(field string) string {
	return "TOLLGATE_" + strings.ToUpper(strings.ReplaceAll(field, ".", "_"))
}

// text declares a string setting taken as it is; check (may be nil) bounds it.
func text[T ~string](field, def, doc string, dst func(*Config) *T, check func(field, v string) error) Setting {
	s := Setting{Field: field, Env: envName(field), Default: def, Doc: doc,
		set: func(c *Config, v string) error { *dst(c) = T(v); return nil },
		get: func(c *Config) string { return string(*dst(c)) }}
	if check != nil {
		s.check = func(c *Config) error { return check(field, string(*dst(c))) }
	}
	return s
}

// secret is a text setting whose value is never printed nor quoted in an
// error (there is no parse error to quote it); Validate checks tokens.
func secret(field, doc string, dst func(*Config) *string) Setting {
	s := text(field, "", doc, dst, nil)
	s.Secret = true
	return s
}

func oneOf[T ~string](field, def string, choices []string, doc string, dst func(*Config) *T) Setting {
	return text(field, def, doc, dst, func(field, v string) error {
		if !slices.Contains(choices, v) {
			return fielderr.New(field, "%q must be one of %v", v, choices)
		}
		return nil
	})
}

func integer[T int | int64](field string, def, lo, hi T, doc string, dst func(*Config) *T) Setting {
	name := envName(field)
	return Setting{Field: field, Env: name, Default: strconv.FormatInt(int64(def), 10), Doc: doc,
		set: func(c *Config, v string) error {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || int64(T(n)) != n {
				return fmt.Errorf("%s: %q is not an integer", name, v)
			}
			*dst(c) = T(n)
			return nil
		},
		get: func(c *Config) string { return strconv.FormatInt(int64(*dst(c)), 10) },
		check: func(c *Config) error {
			if v := *dst(c); v < lo || v > hi {
				return fielderr.New(field, "%d must be in %d..%d", v, lo, hi)
			}
			return nil
		}}
}

func number(field string, def, lo, hi float64, doc string, dst func(*Config) *float64) Setting {
	name := envName(field)
	format := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	return Setting{Field: field, Env: name, Default: format(def), Doc: doc,
		set: func(c *Config, v string) error {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return fmt.Errorf("%s: %q is not a number", name, v)
			}
			*dst(c) = f
			return nil
		},
		get: func(c *Config) string { return format(*dst(c)) },
		check: func(c *Config) error {
			if v := *dst(c); !(v >= lo && v <= hi) {
				return fielderr.New(field, "%v must be in %v..%v", v, lo, hi)
			}
			return nil
		}}
}

func boolean(field string, def bool, doc string, dst func(*Config) *bool) Setting {
	name := envName(field)
	return Setting{Field: field, Env: name, Default: strconv.FormatBool(def), Doc: doc,
		set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%s: %q is not true or false", name, v)
			}
			*dst(c) = b
			return nil
		},
		get: func(c *Config) string { return strconv.FormatBool(*dst(c)) }}
}

func headerPrefix(field, v string) error {
	if !wire.ValidHeaderPrefix(v) {
		return fielderr.New(field, "%q must be 1..32 letters, digits and dashes, not starting with x-tollgate", v)
	}
	return nil
}

// optionalHostPort is hostPort or empty (off).
func optionalHostPort(field, v string) error {
	if v == "" {
		return nil
	}
	return hostPort(field, v)
}

func hostPort(field, v string) error {
	if _, port, err := net.SplitHostPort(v); err != nil || !validPort(port) {
		return fielderr.New(field, "%q must be host:port", v)
	}
	return nil
}

// redisURL checks the URL as start-up will read it, so that -check-config
// refuses what start-up would. Its errors never quote a password.
func redisURL(field, v string) error {
	if v == "" {
		return fielderr.New(field, "must be set")
	}
	if _, err := redisconn.Parse(v); err != nil {
		return fielderr.New(field, "%v", err)
	}
	return nil
}

// Value is a setting's value in c as -check-config prints it: secrets only
// say whether they are set.
func (s *Setting) Value(c *Config) string {
	v := s.get(c)
	if s.Secret {
		if v == "" {
			return "(empty)"
		}
		return "(set)"
	}
	return v
}

// SettingsTable is the Markdown table of every setting, as docs/configuration.md shows it.
func SettingsTable() string {
	var b strings.Builder
	b.WriteString("| variable | file setting | default | meaning |\n| --- | --- | --- | --- |\n")
	for _, s := range Settings {
		def := "empty"
		if s.Default != "" {
			def = "`" + s.Default + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", s.Env, s.Field, def, s.Doc)
	}
	return b.String()
}

// UnknownEnv returns the TOLLGATE_* variables of environ ("K=V" entries)
// that no setting reads: most likely misspelt, and silently ignored otherwise.
func UnknownEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TOLLGATE_") || name == ConfigEnv {
			continue
		}
		if !slices.ContainsFunc(Settings, func(s Setting) bool { return s.Env == name }) {
			out = append(out, name)
		}
	}
	return out
}

func applyEnv(cfg *Config, lookup func(string) (string, bool)) error {
	for _, s := range Settings {
		if v, ok := lookup(s.Env); ok {
			if err := s.set(cfg, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateSettings checks every declared setting's bounds.
func (c *Config) validateSettings() error {
	for _, s := range Settings {
		if s.check != nil {
			if err := s.check(c); err != nil {
				return err
			}
		}
	}
	return c.validateInMemory()
}

// validateInMemory refuses what a service without Redis cannot do: share
// its counters with other replicas, or keep the violation records that
// progressive penalties read (they live in Redis's scripts).
func (c *Config) validateInMemory() error {
	switch {
	case c.RedisEnabled:
		return nil
	case c.Replicas != 1:
		return fielderr.New("replicas", "is %d, but redis_enabled = false keeps every counter in one process: run one instance (replicas = 1), or enable Redis", c.Replicas)
	case c.Penalties.Enabled:
		return fielderr.New("penalties.enabled", "progressive penalties need Redis; they cannot be enabled with redis_enabled = false")
	}
	return nil
}
