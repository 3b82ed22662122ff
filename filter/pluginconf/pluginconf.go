// Package pluginconf parses the filter's plugin configuration: a pure function
// from JSON bytes to a validated Config, with errors that name the field. A bad
// configuration fails plugin start.
package pluginconf

import (
	"bytes"
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-rl/tollgate/filter/internal/jwt"
	"github.com/tollgate-rl/tollgate/shared/ascii"
	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Failure modes (as the control service's).
const (
	FailOpen   = "fail_open"
	FailClosed = "fail_closed"

	// Method override headers (X-HTTP-Method-Override, X-Method-Override,
	// X-HTTP-Method): counted under the method they name too, or removed
	// before the upstream.
	MethodOverrideCount = "count"
	MethodOverrideStrip = "strip"

	EscapedSlashesReject    = "reject"
	EscapedSlashesSeparator = "separator"
)

// Config is the plugin configuration.
type Config struct {
	// ControlCluster is the Envoy cluster of the control service;
	// ControlAuthority its :authority.
	ControlCluster   string `json:"control_cluster"`
	ControlAuthority string `json:"control_authority"`
	// TimeoutMs bounds a callout.
	TimeoutMs   uint32 `json:"timeout_ms"`
	FailureMode string `json:"failure_mode"`
	// DecisionToken is the service credential sent to the control service
	// as "Authorization: Bearer ..." (its TOLLGATE_DECISION_TOKEN). Never logged.
	DecisionToken string `json:"decision_token,omitempty"`
	// DecisionTokenEnv names the VM's environment variable that holds the
	// token instead (Envoy's vm_config.environment_variables, Istio's
	// WasmPlugin vmConfig.env), so that it can come from a Kubernetes
	// Secret and stay out of the plugin configuration. See ResolveToken.
	DecisionTokenEnv string `json:"decision_token_env,omitempty"`
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
	// CostHeaders are the request headers whose values the filter sends
	// with each check (lower-case names, at most 8): a rule's cost_from
	// request_header:<name> reads its cost from one.
	CostHeaders []string `json:"cost_headers,omitempty"`
	// ExcludedPaths (globs) pass without rate limiting.
	ExcludedPaths []string `json:"excluded_paths"`
	// MethodOverride says what the filter does with a method override
	// header, which an upstream (Rails, Laravel, Express's method-override,
	// ASP.NET) may honour: MethodOverrideCount (default) counts the request
	// under the named method too; MethodOverrideStrip removes the headers so
	// the upstream never sees them.
	MethodOverride string `json:"method_override"`
	// EscapedSlashes says what the filter does with a path holding an
	// escaped slash or a backslash (%2F, %5C, \), which upstreams read two
	// ways (a separator to nginx in front of PHP, a character inside one
	// segment to Express or Rails: "/items/7%2F..%2F..%2Fx" is /x to one and
	// item 7 to the other): EscapedSlashesReject (default) refuses it with
	// 400; EscapedSlashesSeparator counts it as separators, for a proxy
	// that unescapes such paths before the upstream (Envoy's
	// path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT, as the
	// shipped configs set it).
	EscapedSlashes string   `json:"escaped_slashes"`
	Lease          Lease    `json:"lease"`
	Breaker        Breaker  `json:"breaker"`
	Fallback       Fallback `json:"fallback"`

	// LegacyTrustedProxyDepth is the old name of a setting whose meaning
	// changed; it is refused with a pointer to xff_trusted_hops rather than
	// silently read the new way.
	LegacyTrustedProxyDepth *int `json:"trusted_proxy_depth,omitempty"`
}

// JWT configures token verification inside the filter.
type JWT struct {
	// JWKS is an inline JSON Web Key Set (RSA, EC P-256 and oct keys).
	JWKS      []byte   `json:"jwks"`
	Issuer    string   `json:"issuer,omitempty"`
	Audiences []string `json:"audiences,omitempty"`
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
}

// Headers selects the response headers.
type Headers struct {
	// XRateLimit adds X-RateLimit-Limit, -Remaining, -Reset, -Window and
	// -Strategy (default true).
	XRateLimit *bool `json:"x_ratelimit,omitempty"`
	// Prefix starts those fields' names (default "X-RateLimit-").
	Prefix string `json:"prefix"`
	// IETF adds the httpapi RateLimit-Policy and RateLimit fields.
	IETF bool `json:"ietf"`
}

// XRateLimitOn reports whether the X-RateLimit-* headers are on.
func (h Headers) XRateLimitOn() bool { return h.XRateLimit == nil || *h.XRateLimit }

// Lease configures the local token cache.
type Lease struct {
	// Request is how many tokens to ask for on a miss (0: no local cache).
	Request int64 `json:"request"`
	// Slots bounds the shared-data slots the cache uses across VMs. The
	// cache is direct-mapped: two buckets active at once in one slot evict
	// each other, and both call out on every request. With B buckets active
	// within a lease's TTL about B/Slots of them share a slot, so the
	// default (16384, at most a few MB of shared data) keeps a thousand
	// active callers' leases; size it at ten times the active buckets.
	Slots uint32 `json:"slots"`
}

// Breaker configures the callout circuit breaker.
type Breaker struct {
	Failures   int   `json:"failures"`
	CooldownMs int64 `json:"cooldown_ms"`
}

// Fallback is what limits requests while failing open (the control service
// cannot be asked).
type Fallback struct {
	// Share is the part of a bucket's last known limit the proxy lets
	// through per window while failing open, counted across its VMs: 1 /
	// the number of proxies keeps a caller at its limit over all of them.
	Share float64 `json:"share"`
	// Limit per WindowSeconds is the per-VM limit of callers whose limit
	// the proxy never saw.
	Limit         int64 `json:"limit"`
	WindowSeconds int64 `json:"window_seconds"`
	// MaxCallers bounds the identities that per-VM limiter tracks.
	MaxCallers int `json:"max_callers"`
}

// Parse reads and validates a configuration. A bad setting is a
// *fielderr.Error naming it by its JSON path ("lease.request",
// "jwt.jwks.keys[0].n"); a document that is not one JSON object is a plain
// error.
func Parse(data []byte) (*Config, error) {
	c := &Config{
		ControlCluster: "controlsvc",
		TimeoutMs:      200,
		FailureMode:    FailOpen,
		IPv6Prefix:     identity.DefaultIPv6Prefix,
		APIKeyHeader:   "x-api-key",
		Lease:          Lease{Request: 10, Slots: 16384},
		Breaker:        Breaker{Failures: 5, CooldownMs: 5000},
		Fallback:       Fallback{Share: 1, Limit: 100, WindowSeconds: 60, MaxCallers: 10000},
		MethodOverride: MethodOverrideCount,
		EscapedSlashes: EscapedSlashesReject,
	}
	data = bytes.TrimSpace(data)
	if len(data) > 0 {
		if err := decode(data, c); err != nil {
			return nil, err
		}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Name checks (no regexp: it would add a quarter of a megabyte to the module).
var (
	clusterChars = ascii.NewSet("A-Za-z0-9_.|:-")
	headerChars  = ascii.NewSet("a-z0-9-")
	claimChars   = ascii.NewSet("A-Za-z0-9_:./-")
)

// validate checks every section and fills the defaults that depend on other
// settings; the first bad setting is the error.
func (c *Config) validate() *fielderr.Error {
	if err := c.validateControl(); err != nil {
		return err
	}
	if err := c.validateCallers(); err != nil {
		return err
	}
	if c.Headers.Prefix == "" {
		c.Headers.Prefix = wire.DefaultHeaderPrefix
	}
	if !wire.ValidHeaderPrefix(c.Headers.Prefix) {
		return fielderr.New("headers.prefix", "%q must be 1..32 letters, digits and dashes, not starting with x-tollgate", c.Headers.Prefix)
	}
	if c.MethodOverride != MethodOverrideCount && c.MethodOverride != MethodOverrideStrip {
		return fielderr.New("method_override", "%q must be %q or %q", c.MethodOverride, MethodOverrideCount, MethodOverrideStrip)
	}
	if c.EscapedSlashes != EscapedSlashesReject && c.EscapedSlashes != EscapedSlashesSeparator {
		return fielderr.New("escaped_slashes", "%q must be %q or %q", c.EscapedSlashes, EscapedSlashesReject, EscapedSlashesSeparator)
	}
	if err := c.Lease.validate(); err != nil {
		return err.In("lease")
	}
	if err := c.Breaker.validate(); err != nil {
		return err.In("breaker")
	}
	if err := c.Fallback.validate(); err != nil {
		return err.In("fallback")
	}
	if c.JWT != nil {
		if err := c.JWT.validate(); err != nil {
			return err.In("jwt")
		}
	}
	return nil
}

// validateControl checks how the filter reaches the control service.
func (c *Config) validateControl() *fielderr.Error {
	if !clusterChars.Match(c.ControlCluster, 1, 256) {
		return fielderr.New("control_cluster", "%q is not a cluster name", c.ControlCluster)
	}
	if c.ControlAuthority == "" {
		c.ControlAuthority = c.ControlCluster
	}
	if strings.ContainsAny(c.ControlAuthority, " \r\n\t/") {
		return fielderr.New("control_authority", "%q is not a host", c.ControlAuthority)
	}
	if err := between("timeout_ms", c.TimeoutMs, 1, 60_000); err != nil {
		return err
	}
	if c.FailureMode != FailOpen && c.FailureMode != FailClosed {
		return fielderr.New("failure_mode", "%q must be %q or %q", c.FailureMode, FailOpen, FailClosed)
	}
	if err := checkToken("decision_token", c.DecisionToken); err != nil {
		return err
	}
	if e := c.DecisionTokenEnv; e != "" {
		if c.DecisionToken != "" {
			return fielderr.New("decision_token_env", "is set beside decision_token: give the token one way")
		}
		if !validEnvName(e) {
			return fielderr.New("decision_token_env", "%q is not an environment variable name (letters, digits and _, not first a digit, at most 128)", e)
		}
	}
	return nil
}

func checkToken(field, t string) *fielderr.Error {
	if t != "" && (len(t) > 1024 || strings.ContainsAny(t, " \t\r\n,") || !isPrintableASCII(t)) {
		return fielderr.New(field, "must be printable ASCII without spaces or commas, at most 1024 bytes")
	}
	return nil
}

func validEnvName(s string) bool {
	if s == "" || len(s) > 128 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// ResolveToken reads the decision token from the environment variable
// decision_token_env names, with lookup (os.LookupEnv in the VM). A variable
// that is unset or empty is an error: a filter started without its
// credential would only fail every callout later.
func (c *Config) ResolveToken(lookup func(string) (string, bool)) *fielderr.Error {
	if c.DecisionTokenEnv == "" {
		return nil
	}
	t, ok := lookup(c.DecisionTokenEnv)
	if !ok || t == "" {
		return fielderr.New("decision_token_env", "%s is not set in the VM's environment (Envoy's vm_config.environment_variables; Istio's WasmPlugin vmConfig.env)", c.DecisionTokenEnv)
	}
	if err := checkToken("decision_token_env", t); err != nil {
		return err
	}
	c.DecisionToken = t
	return nil
}

// validateCallers checks how a request's caller is read: the client
// address, the API key header and the paths that are not counted.
func (c *Config) validateCallers() *fielderr.Error {
	if c.LegacyTrustedProxyDepth != nil {
		return fielderr.New("trusted_proxy_depth", "is no longer read: X-Forwarded-For is trusted only through xff_trusted_hops "+
			"(the proxies in front of Envoy; 0 uses source.address), see docs/security.md")
	}
	if err := cmp.Or(between("xff_trusted_hops", c.XFFTrustedHops, 0, identity.MaxTrustedHops),
		between("ipv6_prefix", c.IPv6Prefix, 32, 128)); err != nil {
		return err
	}
	c.APIKeyHeader = strings.ToLower(c.APIKeyHeader)
	if !headerChars.Match(c.APIKeyHeader, 1, 64) || strings.HasPrefix(c.APIKeyHeader, "x-tollgate-") {
		return fielderr.New("api_key_header", "%q must be a lower-case header name outside x-tollgate-*", c.APIKeyHeader)
	}
	if len(c.CostHeaders) > MaxCostHeaders {
		return fielderr.New("cost_headers", "at most %d headers", MaxCostHeaders)
	}
	for i, h := range c.CostHeaders {
		field := "cost_headers[" + strconv.Itoa(i) + "]"
		switch {
		case !headerChars.Match(h, 1, 64) || h != strings.ToLower(h):
			return fielderr.New(field, "%q must be a lower-case header name", h)
		case slices.Contains(c.CostHeaders[:i], h):
			return fielderr.New(field, "%q is listed twice", h)
		}
	}
	for i, p := range c.ExcludedPaths {
		if err := rules.ValidateGlob(p); err != nil {
			return fielderr.At("excluded_paths["+strconv.Itoa(i)+"]", err)
		}
	}
	return nil
}

// MaxCostHeaders bounds cost_headers (the service takes as many).
const MaxCostHeaders = 8

// between is the error of a setting outside lo..hi, or nil.
func between[T ~int | ~int64 | ~uint32](field string, v, lo, hi T) *fielderr.Error {
	if v < lo || v > hi {
		return fielderr.New(field, "%d must be in %d..%d", v, lo, hi)
	}
	return nil
}

// The sections' checks, each naming its fields relative to the section.
// cmp.Or answers the first failed check, in order.

func (l *Lease) validate() *fielderr.Error {
	return cmp.Or(between("request", l.Request, 0, 10_000), between("slots", l.Slots, 1, 1<<20))
}

func (b *Breaker) validate() *fielderr.Error {
	return cmp.Or(between("failures", b.Failures, 1, 1000), between("cooldown_ms", b.CooldownMs, 10, 600_000))
}

func (f *Fallback) validate() *fielderr.Error {
	if !(f.Share > 0 && f.Share <= 1) {
		return fielderr.New("share", "must be more than 0 and at most 1 (1 / the number of proxies keeps a caller at its limit over all of them)")
	}
	return cmp.Or(between("limit", f.Limit, 1, rules.MaxQuantity), between("window_seconds", f.WindowSeconds, 1, 3600), between("max_callers", f.MaxCallers, 1, 1_000_000))
}

// validate fills the claim names and cache size by default and parses the
// key set into Keys.
func (j *JWT) validate() *fielderr.Error {
	j.SubjectClaim = cmp.Or(j.SubjectClaim, "sub")
	j.TierClaim = cmp.Or(j.TierClaim, "tier")
	j.TenantClaim = cmp.Or(j.TenantClaim, "tenant")
	for _, claim := range []struct{ field, name string }{
		{"subject_claim", j.SubjectClaim}, {"tier_claim", j.TierClaim}, {"tenant_claim", j.TenantClaim},
	} {
		if !claimChars.Match(claim.name, 1, 64) {
			return fielderr.New(claim.field, "%q is not a claim name", claim.name)
		}
	}
	if j.CacheSize == 0 {
		j.CacheSize = 1024
	}
	if err := cmp.Or(between("cache_size", j.CacheSize, 1, 1<<20), between("leeway_seconds", j.LeewaySeconds, 0, 600)); err != nil {
		return err
	}
	if len(j.JWKS) == 0 {
		return fielderr.New("jwks", "is required with jwt")
	}
	// Checked here so a bad key set fails the configuration with its
	// field named; the plugin parses it again for its verifier (a public
	// package exports no internal type).
	_, err := jwt.ParseJWKS(j.JWKS)
	return err
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
