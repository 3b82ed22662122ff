package pluginconf

import (
	"math"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// The configuration is read with wire.Reader, field by field, strictly: a
// key no setting has (in any other case too) is an unknown setting, a key
// given twice in one object is refused (two readers could take either),
// and a value of the wrong kind names its field. null leaves a setting at
// its default. No reflection, no encoding/json: the module is smaller.

// decode reads data into c.
func decode(data []byte, c *Config) error {
	r := wire.NewReader(data)
	if r.Kind() != wire.KindObject {
		return syntaxError(r)
	}
	if err := object(r, "", c.field); err != nil {
		return err
	}
	if r.End() != nil {
		return &fielderr.Error{Reason: "plugin configuration: has data after the JSON value"}
	}
	return nil
}

// fieldFunc reads the value of key, at path, into its setting.
type fieldFunc func(r *wire.Reader, key, path string) error

// object reads an object at path, each key through field; a key repeated
// in it is refused.
func object(r *wire.Reader, path string, field fieldFunc) error {
	if r.Kind() != wire.KindObject {
		return wrongKind(r, path, wire.KindObject)
	}
	var seen []string
	err := r.Object(func(key string) error {
		p := join(path, key)
		for _, s := range seen {
			if s == key {
				return &fielderr.Error{Field: p, Reason: "is given twice"}
			}
		}
		seen = append(seen, key)
		if r.Kind() == wire.KindNull {
			r.Null()
			return nil
		}
		return field(r, key, p)
	})
	if _, ok := err.(*fielderr.Error); ok || err == nil {
		return err
	}
	return syntaxError(r)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func unknown(path string) error { return &fielderr.Error{Field: path, Reason: "unknown setting"} }

// wrongKind names a value of another kind than the setting takes.
func wrongKind(r *wire.Reader, path string, want wire.Kind) error {
	got := r.Kind()
	if got == wire.KindNone {
		return syntaxError(r)
	}
	return &fielderr.Error{Field: path, Reason: "must be " + want.Describe() + ", not " + got.Describe()}
}

func syntaxError(r *wire.Reader) error {
	return &fielderr.Error{Reason: "plugin configuration: malformed JSON at byte " + strconv.Itoa(r.Offset())}
}

func str(r *wire.Reader, path string, dst *string) error {
	if r.Kind() != wire.KindString {
		return wrongKind(r, path, wire.KindString)
	}
	s, err := r.Str()
	if err != nil {
		return syntaxError(r)
	}
	*dst = s
	return nil
}

func boolean(r *wire.Reader, path string, dst *bool) error {
	if r.Kind() != wire.KindBool {
		return wrongKind(r, path, wire.KindBool)
	}
	b, err := r.Bool()
	if err != nil {
		return syntaxError(r)
	}
	*dst = b
	return nil
}

// whole reads a whole number in lo..hi (the range of the setting's type;
// the setting's own bounds are checked after, with its message).
func whole(r *wire.Reader, path string, lo, hi int64) (int64, error) {
	if r.Kind() != wire.KindNumber {
		return 0, wrongKind(r, path, wire.KindNumber)
	}
	n, err := r.Int()
	if err != nil || n < lo || n > hi {
		return 0, &fielderr.Error{Field: path, Reason: "must be a whole number in " + strconv.FormatInt(lo, 10) + ".." + strconv.FormatInt(hi, 10)}
	}
	return n, nil
}

func integer[T ~int | ~int64 | ~uint32](r *wire.Reader, path string, dst *T) error {
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if _, unsigned := any(*dst).(uint32); unsigned {
		lo, hi = 0, math.MaxUint32
	}
	n, err := whole(r, path, lo, hi)
	if err == nil {
		*dst = T(n)
	}
	return err
}

func number(r *wire.Reader, path string, dst *float64) error {
	if r.Kind() != wire.KindNumber {
		return wrongKind(r, path, wire.KindNumber)
	}
	f, err := r.Float()
	if err != nil {
		return &fielderr.Error{Field: path, Reason: "must be a number a float64 holds"}
	}
	*dst = f
	return nil
}

func strList(r *wire.Reader, path string, dst *[]string) error {
	if r.Kind() != wire.KindArray {
		return wrongKind(r, path, wire.KindArray)
	}
	out := []string{}
	err := r.Array(func(i int) error {
		var s string
		err := str(r, path+"["+strconv.Itoa(i)+"]", &s)
		out = append(out, s)
		return err
	})
	if _, ok := err.(*fielderr.Error); err != nil && !ok {
		return syntaxError(r)
	}
	*dst = out
	return err
}

func (c *Config) field(r *wire.Reader, key, path string) error {
	switch key {
	case "control_cluster":
		return str(r, path, &c.ControlCluster)
	case "control_authority":
		return str(r, path, &c.ControlAuthority)
	case "timeout_ms":
		return integer(r, path, &c.TimeoutMs)
	case "failure_mode":
		return str(r, path, &c.FailureMode)
	case "decision_token":
		return str(r, path, &c.DecisionToken)
	case "decision_token_env":
		return str(r, path, &c.DecisionTokenEnv)
	case "xff_trusted_hops":
		return integer(r, path, &c.XFFTrustedHops)
	case "ipv6_prefix":
		return integer(r, path, &c.IPv6Prefix)
	case "trust_x_real_ip":
		return boolean(r, path, &c.TrustXRealIP)
	case "api_key_header":
		return str(r, path, &c.APIKeyHeader)
	case "jwt":
		if c.JWT == nil {
			c.JWT = &JWT{}
		}
		return object(r, path, c.JWT.field)
	case "headers":
		return object(r, path, c.Headers.field)
	case "cost_headers":
		return strList(r, path, &c.CostHeaders)
	case "excluded_paths":
		return strList(r, path, &c.ExcludedPaths)
	case "method_override":
		return str(r, path, &c.MethodOverride)
	case "escaped_slashes":
		return str(r, path, &c.EscapedSlashes)
	case "lease":
		return object(r, path, c.Lease.field)
	case "breaker":
		return object(r, path, c.Breaker.field)
	case "fallback":
		return object(r, path, c.Fallback.field)
	case "trusted_proxy_depth":
		var n int
		c.LegacyTrustedProxyDepth = &n
		return integer(r, path, &n)
	}
	return unknown(path)
}

func (j *JWT) field(r *wire.Reader, key, path string) error {
	switch key {
	case "jwks":
		if k := r.Kind(); k != wire.KindObject {
			return wrongKind(r, path, wire.KindObject)
		}
		raw, err := r.Raw()
		if err != nil {
			return syntaxError(r)
		}
		j.JWKS = raw
		return nil
	case "issuer":
		return str(r, path, &j.Issuer)
	case "audiences":
		return strList(r, path, &j.Audiences)
	case "subject_claim":
		return str(r, path, &j.SubjectClaim)
	case "tier_claim":
		return str(r, path, &j.TierClaim)
	case "tenant_claim":
		return str(r, path, &j.TenantClaim)
	case "reject_invalid":
		return boolean(r, path, &j.RejectInvalid)
	case "leeway_seconds":
		return integer(r, path, &j.LeewaySeconds)
	case "cache_size":
		return integer(r, path, &j.CacheSize)
	}
	return unknown(path)
}

func (h *Headers) field(r *wire.Reader, key, path string) error {
	switch key {
	case "x_ratelimit":
		var b bool
		h.XRateLimit = &b
		return boolean(r, path, &b)
	case "prefix":
		return str(r, path, &h.Prefix)
	case "ietf":
		return boolean(r, path, &h.IETF)
	}
	return unknown(path)
}

func (l *Lease) field(r *wire.Reader, key, path string) error {
	switch key {
	case "request":
		return integer(r, path, &l.Request)
	case "slots":
		return integer(r, path, &l.Slots)
	}
	return unknown(path)
}

func (b *Breaker) field(r *wire.Reader, key, path string) error {
	switch key {
	case "failures":
		return integer(r, path, &b.Failures)
	case "cooldown_ms":
		return integer(r, path, &b.CooldownMs)
	}
	return unknown(path)
}

func (f *Fallback) field(r *wire.Reader, key, path string) error {
	switch key {
	case "share":
		return number(r, path, &f.Share)
	case "limit":
		return integer(r, path, &f.Limit)
	case "window_seconds":
		return integer(r, path, &f.WindowSeconds)
	case "max_callers":
		return integer(r, path, &f.MaxCallers)
	}
	return unknown(path)
}
