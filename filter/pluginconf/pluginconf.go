// Package pluginconf parses the filter's plugin configuration: a pure function
// from JSON bytes to a validated Config, with errors that name the field. A bad
// configuration fails plugin start.
package pluginconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/jwt"
	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Failure modes (as the control service's).
const (
	FailOpen   = "fail_open"
	FailClosed = "fail_closed"
)

// Config is the plugin configuration.
type Config struct {
	// ControlCluster is the Envoy cluster of the control service;
	// ControlAuthority its :authority.
	ControlCluster   string `json:"control_cluster"`
	ControlAuthority string `json:"control_authority"`
	// TimeoutMS bounds a callout.
	TimeoutMS   uint32 `json:"timeout_ms"`
	FailureMode string `json:"failure_mode"`
	// DecisionToken is the service credential sent to the control service
	// as "Authorization: Bearer ..." (its TOLLGATE_DECISION_TOKEN). Never logged.
	DecisionToken string `json:"decision_token,omitempty"`
	// XFFTrustedHops is how many trusted proxies stand in front of Envoy,
	// each appending to X-Forwarded-For; Envoy appends the last entry itself
	// (use_remote_address: true). 0, the default, never reads the header and
	// takes source.address, which Envoy has already resolved: the trust
	// setting then lives in Envoy alone, which is the recommended setup.
	XFFTrustedHops int `json:"xff_trusted_hops"`
	// IPv6Prefix is the prefix length an IPv6 client is counted by (64: one
	// subscriber's /64 is one caller; 128 counts each address).
	IPv6Prefix int `json:"ipv6_prefix"`
	// TrustXRealIP trusts X-Real-IP (only behind a proxy that overwrites it).
	TrustXRealIP bool    `json:"trust_x_real_ip"`
	APIKeyHeader string  `json:"api_key_header"`
	JWT          *JWT    `json:"jwt,omitempty"`
	Headers      Headers `json:"headers"`
	// ExcludedPaths (globs) pass without rate limiting.
	ExcludedPaths []string `json:"excluded_paths"`
	Lease         Lease    `json:"lease"`
	Breaker       Breaker  `json:"breaker"`
	Fallback      Fallback `json:"fallback"`

	// LegacyTrustedProxyDepth is the old name of a setting whose meaning
	// changed; it is refused with a pointer to xff_trusted_hops rather than
	// silently read the new way.
	LegacyTrustedProxyDepth *int `json:"trusted_proxy_depth,omitempty"`
}

// JWT configures token verification inside the filter.
type JWT struct {
	// JWKS is an inline JSON Web Key Set (RSA, EC P-256 and oct keys).
	JWKS      json.RawMessage `json:"jwks"`
	Issuer    string          `json:"issuer,omitempty"`
	Audiences []string        `json:"audiences,omitempty"`
	// Claim names.
	SubjectClaim string `json:"subject_claim"`
	TierClaim    string `json:"tier_claim"`
	TenantClaim  string `json:"tenant_claim"`
	// RejectInvalid answers 401 to an invalid or expired token instead of
	// falling back to the next identity.
	RejectInvalid bool `json:"reject_invalid"`
	// LeewaySeconds tolerates clock skew on exp and nbf.
	LeewaySeconds int64 `json:"leeway_seconds"`
	// CacheSize bounds the cache of verified tokens.
	CacheSize int `json:"cache_size"`

	// Keys are the parsed JWKS (filled by Parse).
	Keys *jwt.KeySet `json:"-"`
}

// Headers selects the response headers.
type Headers struct {
	// XRateLimit adds X-RateLimit-Limit, -Remaining, -Reset (default true).
	XRateLimit *bool `json:"x_ratelimit,omitempty"`
	// IETF adds the httpapi RateLimit-Policy and RateLimit fields.
	IETF bool `json:"ietf"`
}

// XRateLimitOn reports whether the X-RateLimit-* headers are on.
func (h Headers) XRateLimitOn() bool { return h.XRateLimit == nil || *h.XRateLimit }

// Lease configures the local token cache.
type Lease struct {
	// Request is how many tokens to ask for on a miss (0: no local cache).
	Request int64 `json:"request"`
	// Slots bounds the shared-data slots the cache uses across VMs.
	Slots uint32 `json:"slots"`
}

// Breaker configures the callout circuit breaker.
type Breaker struct {
	Failures   int   `json:"failures"`
	CooldownMS int64 `json:"cooldown_ms"`
}

// Fallback is the per-VM limiter used while failing open.
type Fallback struct {
	Limit         int64 `json:"limit"`
	WindowSeconds int64 `json:"window_seconds"`
	// MaxCallers bounds the identities it tracks.
	MaxCallers int `json:"max_callers"`
}

// Parse reads and validates a configuration.
func Parse(data []byte) (*Config, error) {
	c := &Config{
		ControlCluster: "controlsvc",
		TimeoutMS:      200,
		FailureMode:    FailOpen,
		IPv6Prefix:     identity.DefaultIPv6Prefix,
		APIKeyHeader:   "x-api-key",
		Lease:          Lease{Request: 10, Slots: 1024},
		Breaker:        Breaker{Failures: 5, CooldownMS: 5000},
		Fallback:       Fallback{Limit: 100, WindowSeconds: 60, MaxCallers: 10000},
	}
	data = bytes.TrimSpace(data)
	if len(data) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(c); err != nil {
			return nil, describe(err)
		}
		if dec.More() {
			return nil, fmt.Errorf("plugin configuration: data after the JSON object")
		}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func describe(err error) error {
	field, reason := wire.DescribeJSONError(err)
	if field == "body" {
		return fmt.Errorf("plugin configuration: %s", reason)
	}
	if reason == "is not a known field" {
		reason = "unknown setting"
	}
	return fmt.Errorf("%s: %s", field, reason)
}

// Name checks (no regexp: it would add a quarter of a megabyte to the module).
var (
	clusterChars = ascii.NewSet("A-Za-z0-9_.|:-")
	headerChars  = ascii.NewSet("a-z0-9-")
	claimChars   = ascii.NewSet("A-Za-z0-9_:./-")
)

func (c *Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...))
	}
	if !clusterChars.Match(c.ControlCluster, 1, 256) {
		return bad("control_cluster", "%q is not a cluster name", c.ControlCluster)
	}
	if c.ControlAuthority == "" {
		c.ControlAuthority = c.ControlCluster
	}
	if strings.ContainsAny(c.ControlAuthority, " \r\n\t/") {
		return bad("control_authority", "%q is not a host", c.ControlAuthority)
	}
	if c.TimeoutMS < 1 || c.TimeoutMS > 60_000 {
		return bad("timeout_ms", "%d must be in 1..60000", c.TimeoutMS)
	}
	if c.FailureMode != FailOpen && c.FailureMode != FailClosed {
		return bad("failure_mode", "%q must be %q or %q", c.FailureMode, FailOpen, FailClosed)
	}
	if c.LegacyTrustedProxyDepth != nil {
		return bad("trusted_proxy_depth", "is no longer read: X-Forwarded-For is trusted only through xff_trusted_hops "+
			"(the proxies in front of Envoy; 0 uses source.address), see the README's Security model")
	}
	if c.XFFTrustedHops < 0 || c.XFFTrustedHops > identity.MaxTrustedHops {
		return bad("xff_trusted_hops", "%d must be in 0..%d", c.XFFTrustedHops, identity.MaxTrustedHops)
	}
	if c.IPv6Prefix < 32 || c.IPv6Prefix > 128 {
		return bad("ipv6_prefix", "%d must be in 32..128", c.IPv6Prefix)
	}
	if t := c.DecisionToken; t != "" && (len(t) > 1024 || strings.ContainsAny(t, " \t\r\n,") || !isPrintableASCII(t)) {
		return bad("decision_token", "must be printable ASCII without spaces or commas, at most 1024 bytes")
	}
	c.APIKeyHeader = strings.ToLower(c.APIKeyHeader)
	if !headerChars.Match(c.APIKeyHeader, 1, 64) || strings.HasPrefix(c.APIKeyHeader, "x-tollgate-") {
		return bad("api_key_header", "%q must be a lower-case header name outside x-tollgate-*", c.APIKeyHeader)
	}
	for i, p := range c.ExcludedPaths {
		if err := rules.ValidateGlob(p); err != nil {
			return bad(fmt.Sprintf("excluded_paths[%d]", i), "%v", err)
		}
	}
	if c.Lease.Request < 0 || c.Lease.Request > 10_000 {
		return bad("lease.request", "%d must be in 0..10000", c.Lease.Request)
	}
	if c.Lease.Slots < 1 || c.Lease.Slots > 1<<20 {
		return bad("lease.slots", "%d must be in 1..1048576", c.Lease.Slots)
	}
	if c.Breaker.Failures < 1 || c.Breaker.Failures > 1000 {
		return bad("breaker.failures", "%d must be in 1..1000", c.Breaker.Failures)
	}
	if c.Breaker.CooldownMS < 10 || c.Breaker.CooldownMS > 600_000 {
		return bad("breaker.cooldown_ms", "%d must be in 10..600000", c.Breaker.CooldownMS)
	}
	if c.Fallback.Limit < 1 {
		return bad("fallback.limit", "%d must be > 0", c.Fallback.Limit)
	}
	if c.Fallback.WindowSeconds < 1 || c.Fallback.WindowSeconds > 3600 {
		return bad("fallback.window_seconds", "%d must be in 1..3600", c.Fallback.WindowSeconds)
	}
	if c.Fallback.MaxCallers < 1 || c.Fallback.MaxCallers > 1_000_000 {
		return bad("fallback.max_callers", "%d must be in 1..1000000", c.Fallback.MaxCallers)
	}
	if j := c.JWT; j != nil {
		if j.SubjectClaim == "" {
			j.SubjectClaim = "sub"
		}
		if j.TierClaim == "" {
			j.TierClaim = "tier"
		}
		if j.TenantClaim == "" {
			j.TenantClaim = "tenant"
		}
		for field, v := range map[string]string{"jwt.subject_claim": j.SubjectClaim, "jwt.tier_claim": j.TierClaim, "jwt.tenant_claim": j.TenantClaim} {
			if !claimChars.Match(v, 1, 64) {
				return bad(field, "%q is not a claim name", v)
			}
		}
		if j.CacheSize == 0 {
			j.CacheSize = 1024
		}
		if j.CacheSize < 1 || j.CacheSize > 1<<20 {
			return bad("jwt.cache_size", "%d must be in 1..1048576", j.CacheSize)
		}
		if j.LeewaySeconds < 0 || j.LeewaySeconds > 600 {
			return bad("jwt.leeway_seconds", "%d must be in 0..600", j.LeewaySeconds)
		}
		if len(j.JWKS) == 0 {
			return bad("jwt.jwks", "is required with jwt")
		}
		ks, err := jwt.ParseJWKS(j.JWKS)
		if err != nil {
			return fmt.Errorf("jwt.jwks%w", err)
		}
		j.Keys = ks
	}
	return nil
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
